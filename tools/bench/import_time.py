"""Import cost of accel against ``import torch`` (median of fresh processes), and the reference beside.

    python tools/bench/import_time.py [--runs 9]

Goals: ``import accel`` alone imports no torch and takes under 0.1 s; ``import accel_state`` plus
touching a torch-backed name, and ``from accel import Accelerator``, at most 1.02 times ``import torch``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from _common import ratio_line, reference_python

_PROBE = (
    "import time, sys; t = time.perf_counter(); {stmt}; dt = time.perf_counter() - t;"
    " print(dt, int('torch' in sys.modules))"
)


def measure(python: str, stmt: str, runs: int) -> tuple[float, bool]:
    """Median seconds of ``stmt`` in ``runs`` fresh interpreters, and whether torch got imported."""
    times, torch_loaded = [], False
    for _ in range(runs):
        out = subprocess.run([python, "-c", _PROBE.format(stmt=stmt)], capture_output=True, text=True, check=True)
        dt, loaded = out.stdout.split()
        times.append(float(dt))
        torch_loaded = torch_loaded or loaded == "1"
    return statistics.median(times), torch_loaded


def accelerator_available(python: str) -> bool:
    code = "import accel_train.accelerator"
    return subprocess.run([python, "-c", code], capture_output=True).returncode == 0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    py = sys.executable
    results: dict[str, float] = {}
    torch_time, _ = measure(py, "import torch", args.runs)
    print(f"import torch (baseline): {torch_time:.4f} s, median of {args.runs} fresh processes")
    accel_time, accel_torch = measure(py, "import accel", args.runs)
    print(f"{'import accel':<58} {accel_time:10.4f} s   torch imported: {accel_torch}   goal < 0.1 s, no torch")
    state_time, _ = measure(py, "import accel_state; accel_state.gather; accel_state.PartialState", args.runs)
    print(ratio_line("import accel_state (+ gather, PartialState) / torch", state_time, torch_time, goal="<= 1.02"))
    results.update(torch=torch_time, accel=accel_time, accel_state=state_time)
    if accelerator_available(py):
        acc_time, _ = measure(py, "from accel import Accelerator", args.runs)
        print(ratio_line("from accel import Accelerator / import torch", acc_time, torch_time, goal="<= 1.02"))
        results["accelerator"] = acc_time
    ref = reference_python()
    if ref:
        ref_torch, _ = measure(ref, "import torch", args.runs)
        ref_acc, _ = measure(ref, "from accelerate import Accelerator", args.runs)
        print(ratio_line("reference: from accelerate import Accelerator / torch", ref_acc, ref_torch))
        results.update(reference_torch=ref_torch, reference_accelerator=ref_acc)
    else:
        print("reference accelerate: not installed (nox -s bench builds .venv-reference)")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
