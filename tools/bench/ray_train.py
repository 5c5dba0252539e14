"""Ray Train's ``TorchTrainer`` against ``accel launch`` running the same accel training function.

    python tools/bench/ray_train.py [--repeat 2]

Both paths run ``examples/ray_train.py`` on 2 CPU workers (``--plain`` under ``accel launch --cpu
--num_processes 2``; under Ray, a local loopback-only instance started once, not timed). Rank 0 logs
the time of every step. Printed per path, median over the runs:

- steps/s: steps inside an epoch over their time (epoch boundaries, where the Ray path saves and
  reports a checkpoint, left out); the Ray figure over the accel launch one (goal >= 0.95);
- start-up: from the start of the run (the command, or ``trainer.fit()``) to the first step, side by side.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from _common import ROOT, ratio_line, skipped_without

EXAMPLE = ROOT / "examples" / "ray_train.py"


def _rates(log: pathlib.Path, started: float) -> tuple[float, float]:
    """(steps/s inside epochs, seconds from ``started`` to the first step) of one run's step log."""
    rows = [line.split() for line in log.read_text().splitlines() if line.strip()]
    by_epoch: dict[str, list[float]] = {}
    for epoch, stamp in rows:
        by_epoch.setdefault(epoch, []).append(float(stamp))
    steps = sum(len(times) - 1 for times in by_epoch.values())
    seconds = sum(times[-1] - times[0] for times in by_epoch.values())
    return steps / seconds, float(rows[0][1]) - started


def run_launch(work: pathlib.Path, env: dict[str, str]) -> tuple[float, float]:
    out = work / f"launch_{time.monotonic_ns()}"
    log = out / "steps.log"
    out.mkdir()
    command = [sys.executable, "-m", "accel_launch.cli", "launch", "--cpu", "--num_processes", "2", str(EXAMPLE)]
    started = time.time()
    subprocess.run(
        [*command, "--plain", "--out", str(out), "--steps_log", str(log)], env=env, check=True, capture_output=True
    )
    return _rates(log, started)


def run_ray(work: pathlib.Path, repeat: int, env: dict[str, str]) -> list[tuple[float, float]]:
    """``repeat`` TorchTrainer runs under one Ray instance, in a child process (it prints the start times)."""
    code = f"""
import sys, time
sys.path.insert(0, {str(EXAMPLE.parent)!r})
import ray_train
ray_train.loopback_only(num_cpus=3)
for index in range({repeat}):
    out = {str(work)!r} + f"/ray_{{index}}"
    started = time.time()
    result = ray_train.run_with_ray({{"out": out, "steps_log": out + "/steps.log"}}, workers=2, max_failures=0)
    assert result.error is None, result.error
    print("STARTED", out, started, flush=True)
"""
    env = {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(EXAMPLE.parent), env.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True)
    results = []
    for line in done.stdout.splitlines():
        if line.startswith("STARTED"):
            _, out, started = line.split()
            results.append(_rates(pathlib.Path(out) / "steps.log", float(started)))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=2, help="runs per path")
    args = parser.parse_args()
    if skipped_without("ray", hint='install "accel-launch[ray]"'):
        return 0
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    with tempfile.TemporaryDirectory(prefix="accel-bench-ray-") as tmp:
        work = pathlib.Path(tmp)
        launch = [run_launch(work, env) for _ in range(args.repeat)]
        ray = run_ray(work, args.repeat, env)
    launch_rate, launch_start = statistics.median(r for r, _ in launch), statistics.median(s for _, s in launch)
    ray_rate, ray_start = statistics.median(r for r, _ in ray), statistics.median(s for _, s in ray)
    print("== examples/ray_train.py, 2 CPU workers (median of the runs)")
    print(ratio_line("steps/s: Ray TorchTrainer over accel launch", ray_rate, launch_rate, unit="/s", goal=">= 0.95"))
    print(f"{'start-up to the first step: accel launch (command start)':<58} {launch_start:10.3f} s")
    print(f"{'start-up to the first step: Ray (trainer.fit(), Ray running)':<58} {ray_start:10.3f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
