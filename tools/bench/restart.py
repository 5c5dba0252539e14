"""Time from a worker's death to the restarted group's first step: ``accel launch --max_restarts 1``
against a plain ``torch.distributed.run`` restart of the same script (2 CPU processes), and against
the reference ``accelerate launch`` when its venv exists.

    .venv/bin/python tools/bench/restart.py [--repeats 3] [--no-reference]

Goal: accel / torch.distributed.run <= 1.1. Runs alternate between launchers; medians are compared.
torch.distributed.run uses c10d rendezvous with its own worker store per round
(TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1), what accel launch picks for a restartable run; static
rendezvous is not a fair baseline because its restarts fail about one time in three. A run whose
restart fails is counted and reported, not timed.
"""

from __future__ import annotations

import argparse
import ast
import os
import pathlib
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from _common import ROOT, ratio_line, reference_python

WORKER = str(ROOT / "tools" / "bench" / "_restart_worker.py")


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def command(launcher: str, out: str) -> tuple[list[str], dict[str, str]]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    if launcher == "accel":
        cmd = [sys.executable, "-m", "accel_launch.cli", "launch", "--cpu", "--num_processes", "2"]
        return [*cmd, "--max_restarts", "1", WORKER, out, "accel"], env
    if launcher == "torchrun":
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--max_restarts", "1"]
        cmd += ["--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{_port()}"]
        return [*cmd, WORKER, out, "accel"], env
    python = reference_python()
    assert python is not None
    # --multi_gpu on a machine without GPUs: torchrun with 2 CPU processes (its --cpu is one process)
    cmd = [python, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--max_restarts", "1"]
    return [*cmd, WORKER, out, "reference"], env


PHASES = ("started", "imported", "prepared", "loaded", "first_step")


def one_restart(launcher: str) -> dict[str, float] | None:
    """Seconds from the death to each phase of the restarted worker (``first_step`` the total);
    None when the restart failed."""
    out = tempfile.mkdtemp(prefix=f"restart_{launcher}_")
    try:
        cmd, env = command(launcher, out)
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, check=False)
        death, first = os.path.join(out, "death"), os.path.join(out, "first_step")
        if done.returncode != 0 or not (os.path.exists(death) and os.path.exists(first)):
            tail = (done.stdout + done.stderr)[-1500:]
            print(f"  {launcher}: restart failed (exit {done.returncode})\n{tail}", file=sys.stderr)
            return None
        died = float(pathlib.Path(death).read_text())
        marks = ast.literal_eval(pathlib.Path(first).read_text())
        return {phase: marks[phase] - died for phase in PHASES}
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-reference", action="store_true")
    parser.add_argument("--launchers", default="accel,torchrun,reference", help="comma-separated subset")
    args = parser.parse_args()
    launchers = [name for name in args.launchers.split(",") if name in ("accel", "torchrun", "reference")]
    if args.no_reference or reference_python() is None:
        launchers = [name for name in launchers if name != "reference"]
    times: dict[str, list[float]] = {name: [] for name in launchers}
    phases: dict[str, list[dict[str, float]]] = {name: [] for name in launchers}
    failures = dict.fromkeys(launchers, 0)
    for repeat in range(args.repeats):
        for name in launchers:
            started = time.perf_counter()
            marks = one_restart(name)
            seconds = None if marks is None else marks["first_step"]
            if marks is None:
                failures[name] += 1
            else:
                times[name].append(marks["first_step"])
                phases[name].append(marks)
            shown = "failed" if seconds is None else f"{seconds:.2f} s"
            print(
                f"  run {repeat + 1} {name:<9} death->first step {shown}  (whole run {time.perf_counter() - started:.1f} s)"
            )
    medians = {name: statistics.median(values) for name, values in times.items() if values}
    for name in launchers:
        if phases[name]:
            by_phase = {phase: statistics.median(m[phase] for m in phases[name]) for phase in PHASES}
            print(f"{name:<10} median s after the death: " + ", ".join(f"{p} {v:.2f}" for p, v in by_phase.items()))
    for name in launchers:
        print(
            f"{name:<10} restarts timed {len(times[name])}, failed {failures[name]}, median {medians.get(name, float('nan')):.2f} s"
        )
    if "accel" in medians and "torchrun" in medians:
        print(
            ratio_line(
                "restart: death -> first step, accel launch / torchrun",
                medians["accel"],
                medians["torchrun"],
                goal="<= 1.1",
            )
        )
    if "accel" in medians and "reference" in medians:
        print(
            ratio_line(
                "restart: death -> first step, accel / accelerate launch", medians["accel"], medians["reference"]
            )
        )


if __name__ == "__main__":
    main()
