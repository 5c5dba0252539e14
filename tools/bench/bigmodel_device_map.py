"""Benchmark: ``infer_auto_device_map`` on meta models of many leaf modules.

Prints accel against a plain greedy pass (sizes per module, fill the CPU then the disk) and against
the reference, for 5,000 / 10,000 / 20,000 leaf modules, and the time per module at each size
(flat when planning is linear). Goals: at most 2x the plain pass, at least 10x faster than the
reference, linear.

    .venv/bin/python tools/bench/bigmodel_device_map.py [--reference-max-n 20000]

The reference is quadratic here (about 2 minutes for 10,000 modules on a busy 2-core machine), so it
runs only up to ``--reference-max-n`` modules (default 10,000).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from _common import ratio_line, reference_python, run_json, section, this_python

WORKER = os.path.join(os.path.dirname(__file__), "_bigmodel_worker.py")


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reference-max-n", type=int, default=10000)
    args = parser.parse_args()
    ref = reference_python()
    me = this_python()
    per_module = {}
    for n in (5000, 10000, 20000):
        plain = run_json(me, WORKER, "devmap", "--n", str(n), "--mode", "plain", "--repeat", "5")["seconds"]
        ours = run_json(me, WORKER, "devmap", "--n", str(n), "--repeat", "5")["seconds"]
        per_module[n] = ours / n
        section(f"{n} leaf modules")
        print(ratio_line("accel infer_auto_device_map vs plain greedy", ours, plain, goal="<= 2"))
        if ref and n <= args.reference_max_n:
            theirs = run_json(ref, WORKER, "devmap", "--n", str(n), "--lib", "reference", "--repeat", "1")["seconds"]
            print(ratio_line("reference vs plain greedy", theirs, plain))
            print(ratio_line("accel vs reference", ours, theirs, goal="<= 0.1"))
    section("linearity")
    print("accel time per module (us) " + ", ".join(f"{n}: {t * 1e6:.2f}" for n, t in per_module.items()))
    print(
        ratio_line(
            "per-module time, 20,000 vs 5,000 modules",
            per_module[20000] * 1e6,
            per_module[5000] * 1e6,
            unit="us",
            goal="~1 (linear)",
        )
    )
    # Tied halves: every placement in the first half places a module far ahead as well.
    tied = {
        n: run_json(me, WORKER, "devmap", "--n", str(n), "--tied", "--repeat", "3")["seconds"] / n
        for n in (5000, 20000)
    }
    print(
        ratio_line(
            "tied model, per-module time, 20,000 vs 5,000 modules",
            tied[20000] * 1e6,
            tied[5000] * 1e6,
            unit="us",
            goal="~1 (linear)",
        )
    )


if __name__ == "__main__":
    main()
