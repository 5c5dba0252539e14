"""The client cases (TRL, diffusers, sentence-transformers) and how one is run, shared by the test
(on accel) and by tools/record_client_reference.py (on the documented system, to store the figures).

A case is one script run in order in a fresh folder (a full run; a stopped run and its resume), on 1
or 2 processes; each run that writes figures leaves ``FOLDER/MODE.json`` (see tiny.write).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import socket
import subprocess
from typing import Any

from compare import BFLOAT16, FLOAT32, Tolerance

HERE = pathlib.Path(__file__).resolve().parent
REFERENCE = HERE / "reference"

# The client releases the figures are recorded with (and the nox session installs).
VERSIONS = {
    "trl": "1.16.0",
    "diffusers": "0.42.1",
    "sentence-transformers": "6.2.0",
    "transformers": "5.23.0",
    "accelerate": "1.15.0",  # the reference only: accel stands in for it in the test
}


@dataclasses.dataclass(frozen=True)
class Case:
    """One client run.

    Args:
        name: the case's name (its reference file is ``reference/NAME.json``).
        script: the script under integration_tests/clients.
        processes: 1 (python) or 2 (the launcher).
        runs: ``(folder, mode)`` pairs run in order in the same working folder.
        tolerance: how far losses and parameters may be from the reference (compare.py: float32 or
            bfloat16 training).
    """

    name: str
    script: str
    processes: int
    runs: tuple[tuple[str, str], ...]
    tolerance: Tolerance

    @property
    def figures(self) -> list[str]:
        """The figure files the case leaves (stopped runs write none, but for main-stop)."""
        return [f"{folder}/{mode}.json" for folder, mode in self.runs if mode not in ("stop", "sft-stop")]


_SFT_RESUME = (("cut", "sft-stop"), ("cut", "sft-resume"))
_DIFFUSERS_RESUME = (("cut", "stop"), ("cut", "resume"))
# diffusers' examples save on the main process only (explicit folders, oldest removed by hand)
_DIFFUSERS_MAIN_RESUME = (("cut", "main-stop"), ("cut", "main-resume"))
CASES = [
    Case("trl-sft-1", "trl_run.py", 1, (("full", "sft-full"),), FLOAT32),
    Case("trl-sft-1-resume", "trl_run.py", 1, _SFT_RESUME, FLOAT32),
    Case("trl-sft-2", "trl_run.py", 2, (("full", "sft-full"),), FLOAT32),
    Case("trl-sft-2-resume", "trl_run.py", 2, _SFT_RESUME, FLOAT32),
    Case("trl-dpo-1", "trl_run.py", 1, (("dpo", "dpo"),), FLOAT32),
    Case("trl-dpo-2", "trl_run.py", 2, (("dpo", "dpo"),), FLOAT32),
    Case("diffusers-1", "diffusers_run.py", 1, (("full", "full"),), BFLOAT16),
    Case("diffusers-1-resume", "diffusers_run.py", 1, _DIFFUSERS_RESUME, BFLOAT16),
    # 2 processes saving from the main process only; the stopped run's figures are compared too, and the
    # resumed run's in full (issue 25: a resumed loader draws from torch's generator as documented)
    Case("diffusers-2-resume", "diffusers_run.py", 2, _DIFFUSERS_MAIN_RESUME, BFLOAT16),
    Case("st-1", "st_run.py", 1, (("st", "full"),), FLOAT32),
    Case("st-2", "st_run.py", 2, (("st", "full"),), FLOAT32),
]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def command(python: str, processes: int, on_accel: bool) -> list[str]:
    """How a script is started: ``python`` alone, or the launcher of accel or of the documented system."""
    if processes == 1:
        return [python]
    port = str(_free_port())
    if on_accel:
        return [
            python,
            "-m",
            "accel_launch.cli",
            "launch",
            "--cpu",
            "--num_processes",
            str(processes),
            "--main_process_port",
            port,
        ]
    # the documented system's launcher has no multi-process CPU path without MPI (its `--cpu` starts one
    # process, and `--multi_gpu` leaves a script's own Accelerator undistributed on a machine without
    # GPUs): torch's launcher with ACCELERATE_USE_CPU (environment()), gloo on CPU as accel's `--cpu` here
    return [
        python, "-m", "torch.distributed.run", "--nproc_per_node", str(processes), "--nnodes", "1",
        "--master_addr", "127.0.0.1", "--master_port", port,
    ]  # fmt: skip


def environment(on_accel: bool) -> dict[str, str]:
    """The variables every run gets: offline, one thread, the scripts importable, accel's alias on accel."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    }
    if on_accel:
        env["ACCEL_PROVIDE_ACCELERATE"] = "1"
    else:
        env.pop("ACCEL_PROVIDE_ACCELERATE", None)
        env["ACCELERATE_USE_CPU"] = "true"  # several processes on CPU (see command()); one process: no change
    return env


def run(
    case: Case,
    python: str,
    workdir: pathlib.Path,
    on_accel: bool,
    timeout: float = 600,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run every step of ``case`` in ``workdir``; return its figures by file name.

    ``env`` adds variables (``CLIENT_PERTURB``: tiny.perturbation).

    Raises:
        RuntimeError: a step exited non-zero (the message holds the end of its output).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    for folder, mode in case.runs:
        done = subprocess.run(
            [*command(python, case.processes, on_accel), str(HERE / case.script), folder, mode],
            cwd=workdir,
            env={**environment(on_accel), **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"{case.name} {folder} {mode} exited {done.returncode}:\n{(done.stdout + done.stderr)[-6000:]}"
            )
    return {name: json.loads((workdir / name).read_text()) for name in case.figures}
