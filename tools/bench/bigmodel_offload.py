"""Benchmark: forward pass of a disk-offloaded model against the same model in memory, and the reference.

Two models: 8 layers of 4096x4096 (64 MB each; batch 64) and 10,000 layers of 32x32 (batch 16).
Each offloaded run checks its output equals the in-memory model's and reports the extra peak memory
(ru_maxrss) against one layer. Runs with one torch thread by default (``--threads``): on a shared
2-core machine, intra-op threads make tiny layers 20x slower and the figures meaningless.
Goals: at most 1.4x (large layers) and 4x (small layers) the in-memory forward.

    .venv/bin/python tools/bench/bigmodel_offload.py [--scale 0.5] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from _common import ratio_line, reference_python, run_json, section, this_python

WORKER = os.path.join(os.path.dirname(__file__), "_bigmodel_worker.py")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--root", default=None, help="folder for the generated files (default: a new one under /tmp)")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    ref = reference_python()
    me = this_python()
    if args.root is None:
        args.root = tempfile.mkdtemp(prefix="accel-bench-bigmodel-")
    os.makedirs(args.root, exist_ok=True)
    for kind, label, goal in (("large", "8 x 64 MB layers", "<= 1.4"), ("small", "10,000 small layers", "<= 4")):
        path = os.path.join(args.root, f"offload-{kind}")
        shutil.rmtree(path, ignore_errors=True)
        common = [
            "--kind",
            kind,
            "--path",
            path,
            "--scale",
            str(args.scale),
            "--repeat",
            str(args.repeat),
            "--threads",
            str(args.threads),
        ]
        memory = run_json(me, WORKER, "forward", *common, "--mode", "memory")["seconds"]
        run_json(me, WORKER, "forward", *common, "--mode", "prepare")
        ours = run_json(me, WORKER, "forward", *common)
        section(f"{label} (scale {args.scale}, {args.threads} thread(s))")
        print(ratio_line("accel disk_offload forward vs in memory", ours["seconds"], memory, goal=goal))
        print(
            f"  outputs equal: {ours['equal']}; extra peak memory {ours['extra_peak_bytes'] / 2**20:.1f} MiB "
            f"= {ours['extra_peak_bytes'] / ours['block_bytes']:.1f} layers "
            f"= {100 * ours['extra_peak_bytes'] / ours['model_bytes']:.0f}% of the model"
        )
        if ref:
            run_json(ref, WORKER, "forward", *common, "--lib", "reference", "--mode", "prepare")
            theirs = run_json(ref, WORKER, "forward", *common, "--lib", "reference")
            print(ratio_line("reference disk_offload forward vs in memory", theirs["seconds"], memory))
            print(ratio_line("accel vs reference", ours["seconds"], theirs["seconds"]))
            print(
                f"  reference outputs equal: {theirs['equal']}; extra peak memory {theirs['extra_peak_bytes'] / 2**20:.1f} MiB"
            )
        shutil.rmtree(path, ignore_errors=True)
        for leftover in (path + ".expected.pt", path + ".state.pt"):
            if os.path.exists(leftover):
                os.remove(leftover)

    shutil.rmtree(args.root, ignore_errors=True)


if __name__ == "__main__":
    main()
