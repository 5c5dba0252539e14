"""The meta-package installed alone: the README's training example with python and with
``accel launch --cpu --num_processes 2``, then ``accel test`` on a 2-process CPU config."""

from __future__ import annotations

import os
import pathlib
import re
import sys
import tempfile

from _common import check, installed_distributions, run

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"

CPU_2_CONFIG = """compute_environment: LOCAL_MACHINE
distributed_type: MULTI_CPU
mixed_precision: 'no'
num_machines: 1
num_processes: 2
use_cpu: true
"""


def readme_training_script() -> str:
    """The first Python block of the README (the training example), as the reader copies it."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
    check(bool(blocks), f"no python example in {README}")
    return blocks[0]


def main() -> None:
    print("installed:", ", ".join(installed_distributions()))
    with tempfile.TemporaryDirectory() as folder:
        os.chdir(folder)
        with open("train.py", "w", encoding="utf-8") as f:
            f.write(readme_training_script())
        out = run(sys.executable, "train.py")
        check("done, loss" in out, f"python train.py printed {out!r}")
        check(os.path.isfile(os.path.join("checkpoint", "model.safetensors")), "save_state wrote no model.safetensors")
        out = run("accel", "launch", "--cpu", "--num_processes", "2", "train.py")
        check(out.count("done, loss") == 1, f"accel launch train.py printed {out!r}")
        with open("cpu2.yaml", "w", encoding="utf-8") as f:
            f.write(CPU_2_CONFIG)
        out = run("accel", "test", "--config_file", "cpu2.yaml")
        check("Test is a success" in out, f"accel test printed {out!r}")
    print("accel smoke: README example (python, accel launch 2 CPU processes) and accel test (2 processes) OK")


if __name__ == "__main__":
    main()
