"""Import, once, the heavy modules a test session's processes will import, so that Python writes their
bytecode before the tests start many processes at once.

A fresh venv has no bytecode. The first processes of a test session start together (pytest-xdist workers,
a pool's 2 or 4 ranks, the ranks of a launch), find none, and each compiles the same modules: torch,
``torch._dynamo`` (which every ``torch.optim`` optimizer imports), accel, DeepSpeed, the client libraries.
Measured on 2 cores: four training scripts started together in a fresh venv took 57.7 CPU-s, and 24.3 once
the bytecode was there; one process importing them first costs about 10 CPU-s. The nox sessions run this
before their tests (``noxfile._pytest``).

Modules that are not installed are skipped, and a module that fails to import is reported and skipped:
this only saves time, it checks nothing (the tests do).

Usage: ``python tools/warm_bytecode.py [MODULE ...]`` (default: `MODULES`).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import time

#: What the test processes of the CI sessions import, heaviest first; only the installed ones are imported.
MODULES = (
    "torch",
    "torch._dynamo",
    "torch.distributed.fsdp",
    "torch.distributed.checkpoint",
    "torch.distributed.tensor",
    "torch.distributed.elastic.multiprocessing",
    "numpy",
    "safetensors.torch",
    "accel",
    "accel_state.testing",
    "accel_train.accelerator",
    "accel_launch.cli",
    "deepspeed",
    "transformers.trainer",
    "peft",
    "trl",
    "diffusers",
    "sentence_transformers",
    "datasets",
    "ray.train.torch",
)


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module.split(".", 1)[0]) is not None
    except (ImportError, ValueError):
        return False


def warm(modules: tuple[str, ...] | list[str]) -> list[str]:
    """Import each installed module of ``modules``; return one line per module imported or failed."""
    lines = []
    for module in modules:
        if not _installed(module):
            continue
        start = time.perf_counter()
        try:
            importlib.import_module(module)
        except Exception as error:  # an optimisation only: the tests report real failures
            lines.append(f"{module}: not imported ({type(error).__name__}: {str(error)[:200]})")
            continue
        lines.append(f"{module}: {time.perf_counter() - start:.1f} s")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Import the modules named (default: `MODULES`) and print what each took."""
    # the client libraries import `accelerate`, which accel provides under this opt-in (accel.accelerate_alias);
    # it is read at interpreter start, so the caller sets it (noxfile does)
    if os.environ.get("ACCEL_PROVIDE_ACCELERATE") is None:
        print("warm_bytecode: ACCEL_PROVIDE_ACCELERATE is not set; client libraries needing accelerate are skipped")
    names = (argv if argv is not None else sys.argv[1:]) or list(MODULES)
    start = time.perf_counter()
    lines = warm(names)
    print(f"warm_bytecode: {len(lines)} modules in {time.perf_counter() - start:.1f} s; " + "; ".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
