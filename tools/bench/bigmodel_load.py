"""Benchmark: loading a checkpoint into an empty model, against plain safetensors and the reference.

Prints, for a ~2 GB sharded checkpoint of large tensors and a ~200 MB one of 20,000 small tensors:
the call plus a first read of every weight, with ``device_map={"": "cpu"}`` and with half the
model sent to disk by ``device_map="auto"``, as ratios to plain ``safetensors.torch.load_file`` +
``load_state_dict(assign=True)``. Goals: at most 1.2x (CPU) and 3x (half on disk).

    .venv/bin/python tools/bench/bigmodel_load.py [--scale 0.25] [--skip-reference-offload]

Checkpoints are written under /tmp (``--root``), never in the repository.
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
    parser.add_argument("--scale", type=float, default=1.0, help="shrink the checkpoints (1.0 = 2 GB and 200 MB)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--skip-reference-offload", action="store_true", help="the reference takes minutes on 20,000 tensors"
    )
    args = parser.parse_args()
    ref = reference_python()
    me = this_python()
    if args.root is None:
        args.root = tempfile.mkdtemp(prefix="accel-bench-bigmodel-")
    os.makedirs(args.root, exist_ok=True)
    for kind, label in (("large", "~2 GB, 64 MB tensors"), ("small", "~200 MB, 20,000 tensors")):
        path = os.path.join(args.root, kind)
        common = ["--kind", kind, "--path", path, "--scale", str(args.scale), "--repeat", str(args.repeat)]
        run_json(me, WORKER, "make", *common)
        plain = run_json(me, WORKER, "load", *common, "--mode", "plain")["seconds"]
        ours = run_json(me, WORKER, "load", *common, "--mode", "lib")["seconds"]
        ours_off = run_json(me, WORKER, "load", *common, "--mode", "offload")["seconds"]
        section(f"{label} (scale {args.scale})")
        print(ratio_line("accel, device_map={'': 'cpu'} vs plain", ours, plain, goal="<= 1.2"))
        print(ratio_line("accel, half on disk (auto) vs plain", ours_off, plain, goal="<= 3"))
        if ref:
            theirs = run_json(ref, WORKER, "load", *common, "--mode", "lib", "--lib", "reference")["seconds"]
            print(ratio_line("reference, device_map={'': 'cpu'} vs plain", theirs, plain))
            print(ratio_line("accel vs reference (cpu)", ours, theirs))
            if not (args.skip_reference_offload and kind == "small"):
                theirs_off = run_json(
                    ref, WORKER, "load", *common, "--mode", "offload", "--lib", "reference", "--repeat", "1"
                )["seconds"]
                print(ratio_line("reference, half on disk vs plain", theirs_off, plain))
                print(ratio_line("accel vs reference (half on disk)", ours_off, theirs_off))
        else:
            print("(no reference interpreter: build it with `nox -s bench`)")
        shutil.rmtree(path, ignore_errors=True)

    shutil.rmtree(args.root, ignore_errors=True)


if __name__ == "__main__":
    main()
