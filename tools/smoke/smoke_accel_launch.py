"""accel-launch installed alone: accel launch --cpu --num_processes 2, accel env, accel config default."""

from __future__ import annotations

import os
import tempfile

from _common import check, installed_distributions, run

SCRIPT = """
from accel_state import PartialState
from accel_state.operations import gather_object

state = PartialState()
ranks = gather_object([state.process_index])
if state.is_main_process:
    print("ranks", ranks, state.distributed_type.value)
"""


def main() -> None:
    print("installed:", ", ".join(installed_distributions()))
    with tempfile.TemporaryDirectory() as folder:
        script = os.path.join(folder, "ranks.py")
        with open(script, "w", encoding="utf-8") as f:
            f.write(SCRIPT)
        out = run("accel", "launch", "--cpu", "--num_processes", "2", script)
        check("ranks [0, 1] MULTI_CPU" in out, f"accel launch output: {out!r}")
        config = os.path.join(folder, "default.yaml")
        run("accel", "config", "default", "--config_file", config)
        check(os.path.isfile(config), "accel config default wrote no file")
        env = run("accel", "env", "--config_file", config)
        check("accel-launch" in env and "accel-state" in env, f"accel env leaves out a package: {env}")
        version = run("accel", "--version")
        check("accel-launch" in version, f"accel --version: {version!r}")
    print("accel-launch smoke: accel launch on 2 CPU processes, accel config default, accel env OK")


if __name__ == "__main__":
    main()
