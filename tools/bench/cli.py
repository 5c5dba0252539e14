"""Benchmark of the ``accel`` command: help start-up and multi-process launch overhead.

    python tools/bench/cli.py [--repeat 7] [--launch-repeat 5]

1. ``accel --help``, ``accel launch --help``, ``accel config --help``: wall time (goal <= 0.15 s) and
   whether torch was imported (goal: never), with the reference ``accelerate`` beside.
2. Start-up of a trivial 2-process gloo script (init, barrier, destroy) under ``accel launch --cpu
   --num_processes 2`` against plain ``python -m torch.distributed.run --nproc_per_node 2`` in the same
   run, interleaved to share the machine's noise (goal <= 1.03x); the reference ``accelerate launch
   --multi_gpu --num_processes 2`` (its ``--cpu`` path starts one process only) measured beside.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from _common import ROOT, ratio_line, reference_python

TRIVIAL = """\
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
"""

TORCH_PROBE = (
    "import runpy, sys\nsys.argv = {argv!r}\ntry:\n    runpy.run_module({module!r}, run_name='__main__')\n"
    "except SystemExit:\n    pass\nsys.stdout.flush()\nprint('TORCH' if 'torch' in sys.modules else 'NO_TORCH', file=sys.stderr)\n"
)


def accel_cmd() -> list[str]:
    """The ``accel`` console script next to this interpreter, else ``python -m accel_launch.cli``."""
    script = pathlib.Path(sys.executable).with_name("accel")
    return [str(script)] if script.exists() else [sys.executable, "-m", "accel_launch.cli"]


def reference_cmd() -> list[str] | None:
    python = reference_python()
    if python is None:
        return None
    script = pathlib.Path(python).with_name("accelerate")
    return [str(script)] if script.exists() else [python, "-m", "accelerate.commands.accelerate_cli"]


def _env(home: str) -> dict[str, str]:
    return {**os.environ, "HF_HOME": home, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


def _time(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stderr[-2000:]}")
    return elapsed


def imports_torch(python: str, module: str, argv: list[str], env: dict[str, str]) -> bool:
    code = TORCH_PROBE.format(argv=argv, module=module)
    result = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env, check=False)
    return result.stderr.strip().endswith("TORCH") and not result.stderr.strip().endswith("NO_TORCH")


def bench_help(repeat: int, env: dict[str, str]) -> None:
    print("== help start-up (median wall time; goal <= 0.15 s and no torch import)")
    ref = reference_cmd()
    for sub in ([], ["launch"], ["config"]):
        argv = [*sub, "--help"]
        ours = statistics.median(_time([*accel_cmd(), *argv], env) for _ in range(repeat))
        torch_ours = imports_torch(sys.executable, "accel_launch.cli", ["accel", *argv], env)
        label = f"accel {' '.join(argv)}"
        line = f"{label:<32} {ours:7.3f} s   torch imported: {'yes' if torch_ours else 'no'}"
        if ref is not None:
            theirs = statistics.median(_time([*ref, *argv], env) for _ in range(repeat))
            line += f"   | reference accelerate: {theirs:7.3f} s ({theirs / ours:5.1f}x slower)"
        print(line)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def bench_launch(repeat: int, env: dict[str, str], script: str) -> None:
    print("== start-up of a trivial 2-process gloo script (median wall time, runs interleaved)")
    variants: dict[str, object] = {
        "python -m torch.distributed.run --nproc_per_node 2": lambda p: [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_port",
            str(p),
            script,
        ],
        "accel launch --cpu --num_processes 2": lambda p: [
            *accel_cmd(),
            "launch",
            "--cpu",
            "--num_processes",
            "2",
            "--main_process_port",
            str(p),
            script,
        ],
    }
    ref = reference_cmd()
    if ref is not None:
        variants["reference: accelerate launch --multi_gpu --num_processes 2"] = lambda p: [
            *ref,
            "launch",
            "--multi_gpu",
            "--num_processes",
            "2",
            "--mixed_precision",
            "no",
            "--dynamo_backend",
            "no",
            "--num_machines",
            "1",
            "--main_process_port",
            str(p),
            script,
        ]
    times: dict[str, list[float]] = {name: [] for name in variants}
    for build in variants.values():  # warm-up (file cache)
        _time(build(_free_port()), env)  # type: ignore[operator]
    for _ in range(repeat):
        for name, build in variants.items():
            times[name].append(_time(build(_free_port()), env))  # type: ignore[operator]
    base_name = next(iter(variants))
    base = statistics.median(times[base_name])
    for name in variants:
        value = statistics.median(times[name])
        goal = "<= 1.03" if name.startswith("accel launch") else ""
        print(ratio_line(name, value, base, goal=goal))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=7, help="runs per help command")
    parser.add_argument("--launch-repeat", type=int, default=5, help="runs per launch variant")
    parser.add_argument("--skip-launch", action="store_true")
    args = parser.parse_args()
    home = tempfile.mkdtemp(prefix="accel-bench-home-")
    workdir = tempfile.mkdtemp(prefix="accel-bench-")
    try:
        env = _env(home)
        print(f"accel: {' '.join(accel_cmd())}   reference: {' '.join(reference_cmd() or ['(none)'])}   root: {ROOT}")
        bench_help(args.repeat, env)
        if not args.skip_launch:
            script = str(pathlib.Path(workdir) / "trivial.py")
            pathlib.Path(script).write_text(TRIVIAL)
            bench_launch(args.launch_repeat, env, script)
    finally:
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
