"""Benchmark: a 2 GB safetensors checkpoint loaded to the CPU with a warm page cache, call alone and call + touch.

``load_checkpoint_and_dispatch(model, folder, device_map={"": "cpu"})`` against plain
``safetensors.torch.load_file`` + ``load_state_dict(assign=True)``, alternating in one process
(``--repeat`` rounds, medians of the per-round ratios), and the same for the reference
``accelerate`` release in its own interpreter. Both sides map the files, so the call alone measures
the per-tensor work (planning, key checks, placement) and the touch the page faults.
Goals: call + touch <= 1.2, call alone <= 1.5.

    .venv/bin/python tools/bench/bigmodel_load_warm.py [--repeat 15] [--scale 1.0] [--baseline-src DIR]

``--baseline-src`` adds a row for another accel-bigmodel source tree (its ``src`` folder, for
example one exported from an earlier commit with ``git archive``), measured in the same run.
Checkpoints are written under /tmp, never in the repository.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from _common import ratio_line, reference_python, run_json, this_python

WORKER = os.path.join(os.path.dirname(__file__), "_bigmodel_worker.py")


def _row(label: str, result: dict[str, float]) -> None:
    print(
        f"{label}: call {result['lib_call']:.4f} s (plain {result['plain_call']:.4f} s), call + touch "
        f"{result['lib_touch']:.4f} s (plain {result['plain_touch']:.4f} s)"
    )
    print(
        ratio_line(f"  {label}: call alone vs plain (median ratio)", result["ratio_call"], 1.0, unit="x", goal="<= 1.5")
    )
    print(
        ratio_line(
            f"  {label}: call + touch vs plain (median ratio)", result["ratio_touch"], 1.0, unit="x", goal="<= 1.2"
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=None, help="folder for the checkpoint (default: a new one under /tmp)")
    parser.add_argument("--scale", type=float, default=1.0, help="1.0 = 2 GB (32 tensors of 64 MB)")
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--baseline-src", default=None, help="an accel-bigmodel src folder to measure beside")
    args = parser.parse_args()
    root = args.root or tempfile.mkdtemp(prefix="accel-bench-warm-")
    path = os.path.join(root, "large")
    common = ["--kind", "large", "--path", path, "--scale", str(args.scale), "--repeat", str(args.repeat)]
    try:
        run_json(this_python(), WORKER, "make", *common)
        print(f"~{2 * args.scale:.1f} GB safetensors checkpoint, warm page cache, {args.repeat} alternating rounds")
        ours = run_json(this_python(), WORKER, "warm", *common)
        _row("accel", ours)
        if args.baseline_src:
            env = {"PYTHONPATH": os.path.abspath(args.baseline_src)}
            before = run_json(this_python(), WORKER, "warm", *common, env=env)
            _row(f"accel from {args.baseline_src}", before)
        ref = reference_python()
        if ref:
            theirs = run_json(ref, WORKER, "warm", *common, "--lib", "reference")
            _row("reference", theirs)
            print(ratio_line("accel vs reference, call alone", ours["ratio_call"], theirs["ratio_call"], unit="x"))
            print(ratio_line("accel vs reference, call + touch", ours["ratio_touch"], theirs["ratio_touch"], unit="x"))
        else:
            print("(no reference interpreter: build it with `nox -s bench`)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
