"""Record what the documented system's resumed loaders read, for ``test_resume_order_reference.py``.

Runs ``integration_tests/resume_order_job.py`` on Hugging Face Accelerate (its ``REFERENCE_CASES`` and
``STATEFUL_CASES``: one and two CPU processes through ``torch.distributed.run``; torchdata installed) and stores every process's batches and random
draws of the ``save`` and ``resume`` phases in ``integration_tests/reference/resume_order.json``. CI
compares accel's runs with that file and installs no second stack.

    python tools/record_resume_order_reference.py [--python .venv-reference/bin/python]

The reference venv holds accelerate 1.15.0, torchdata (for ``use_stateful_dataloader``) and this
repository's torch (``uv pip install -c tools/constraints.txt torch==2.13.0 accelerate==1.15.0 torchdata``).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
JOB = ROOT / "integration_tests" / "resume_order_job.py"
STORE = ROOT / "integration_tests" / "reference" / "resume_order.json"
sys.path.insert(0, str(JOB.parent))

from resume_order_job import PHASES, REFERENCE_CASES, STATEFUL_CASES, read_logs  # noqa: E402


def run_case(python: str, processes: int, args: list[str]) -> dict[str, dict[str, list]]:
    """Both phases of one case; returns {phase: {rank: log}}."""
    env = {**os.environ, "RESUME_ORDER_LIB": "accelerate", "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as folder:
        for phase in PHASES:
            launch = [python, str(JOB)]
            if processes > 1:  # the documented system's CPU processes: WORLD_SIZE with ACCELERATE_USE_CPU
                launch = [python, "-m", "torch.distributed.run", "--nproc_per_node", str(processes), str(JOB)]
            subprocess.run([*launch, phase, folder, *args], check=True, env=env, capture_output=True, text=True)
        return read_logs(folder, processes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=str(ROOT / ".venv-reference" / "bin" / "python"))
    args = parser.parse_args()
    version = subprocess.run(
        [args.python, "-c", "import accelerate, torch; print(accelerate.__version__, torch.__version__)"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    figures = {
        name: run_case(args.python, processes, [str(epoch), str(step), *options])
        for name, (processes, epoch, step, options) in {**REFERENCE_CASES, **STATEFUL_CASES}.items()
    }
    STORE.parent.mkdir(parents=True, exist_ok=True)
    STORE.write_text(json.dumps({"accelerate": version[0], "torch": version[1], "cases": figures}, indent=1) + "\n")
    print(f"wrote {STORE.relative_to(ROOT)}: {len(figures)} cases on accelerate {version[0]}, torch {version[1]}")


if __name__ == "__main__":
    main()
