"""Launch utilities (documented as ``accel.utils.launch``): the command and environment of each launcher.

They take the ``argparse.Namespace`` of ``accel launch`` (flags not given are ``None`` or ``False``) and return
what the launcher would run; ``PrepareForLaunch`` wraps a function so that each spawned process knows
its rank. Nothing here imports torch at module level.
"""

from __future__ import annotations

import argparse
import os
import subprocess  # the launcher looks it (and `which`) up here, so that tests can patch them
from collections.abc import Mapping
from shutil import which
from typing import Any

from accel_launch.commands_build import (
    MPI_INTEL_SPELLING,
    deepspeed_command,
    env_file_lines,
    script_command,
    torchrun_args,
)
from accel_launch.launch_args import given_flags
from accel_launch.plan import LaunchPlan, MachineInfo, resolve
from accel_launch.runner import free_port, is_port_in_use, launch_env

get_free_port = free_port  # the documented system's name

__all__ = [
    "PrepareForLaunch",
    "convert_dict_to_env_variables",
    "free_port",
    "get_free_port",
    "is_port_in_use",
    "mpirun_spelling",
    "prepare_deepspeed_cmd_env",
    "prepare_multi_gpu_env",
    "prepare_sagemager_args_inputs",
    "prepare_simple_launcher_cmd_env",
    "prepare_tpu",
]


def plan_from_args(args: argparse.Namespace, machine: MachineInfo | None = None, config: Any = None) -> LaunchPlan:
    """The launch plan of a parsed ``accel launch`` namespace (attributes left ``None`` are not given)."""
    flags = given_flags(args)
    if machine is None:
        from accel_launch.machine import cpu_machine, detect_machine

        machine = cpu_machine() if flags.get("cpu") else detect_machine()
    script_args = getattr(args, "training_script_args", None) or []
    return resolve(flags, config, machine, getattr(args, "training_script", ""), script_args)


def prepare_simple_launcher_cmd_env(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """Command and full environment of a one-process launch.

    Args:
        *args: The parsed arguments of `accel launch`.
    """
    plan = plan_from_args(args)
    return script_command(plan), {**os.environ, **launch_env(plan)}


def _report_port(args: argparse.Namespace, plan: LaunchPlan) -> int:
    """The port of the launch (a free one for ``main_process_port`` 0, 29500 when none is given),
    written back to ``args.main_process_port`` and ``args.master_port`` as the documented helpers do."""
    port = plan.main_process_port
    if port == 0:
        port = free_port()
    elif port is None:
        port = 29500
    args.main_process_port = port
    args.master_port = str(port)
    return port


def prepare_multi_gpu_env(args: argparse.Namespace) -> dict[str, str]:
    """Full environment of a torch.distributed.run launch (the torchrun arguments under ``ACCEL_TORCHRUN_ARGS``).

    The port it chose (a free one for ``--main_process_port 0``) is in ``args.main_process_port`` and
    ``MASTER_PORT`` afterwards.

    Args:
        *args: The parsed arguments of `accel launch`.
    """
    plan = plan_from_args(args)
    port = _report_port(args, plan)
    env = {**os.environ, **launch_env(plan)}
    env["MASTER_ADDR"] = plan.main_process_ip or "127.0.0.1"
    env["MASTER_PORT"] = str(port)
    env["ACCEL_TORCHRUN_ARGS"] = " ".join(torchrun_args(plan, port))
    return env


def prepare_deepspeed_cmd_env(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """The ``deepspeed`` command and full environment of a multi-node DeepSpeed launch (the port it
    chose is in ``args.main_process_port`` afterwards).

    Args:
        *args: The parsed arguments of `accel launch`.
    """
    plan = plan_from_args(args)
    port = _report_port(args, plan)
    return deepspeed_command(plan, port), {**os.environ, **launch_env(plan)}


def mpirun_spelling() -> tuple[str, str, str, str, str]:
    """(program, hostfile flag, process-count flag, per-node flag, bind flag) of the MPI found on the
    ``PATH``: Open MPI spells them ``--hostfile``, ``-n``, ``--npernode``, ``--bind-to``; Intel MPI and
    MVAPICH ``-f``, ``-n``, ``-ppn``.

    Raises:
        OSError: neither ``mpirun`` nor ``mpiexec`` is on the ``PATH``.
    """
    programs = [name for name in ("mpirun", "mpiexec") if which(name)]
    if not programs:
        raise OSError("neither mpirun nor mpiexec was found: install Intel MPI, Open MPI or MVAPICH")
    program = programs[0]
    version = subprocess.check_output([program, "--version"])
    if b"Open MPI" in version:
        return program, "--hostfile", "-n", "--npernode", "--bind-to"
    return (program, *MPI_INTEL_SPELLING[1:])  # type: ignore[return-value]


_get_mpirun_args = mpirun_spelling  # the documented system's (private) name


def prepare_tpu(
    args: argparse.Namespace, current_env: dict[str, str], pod: bool = False
) -> tuple[argparse.Namespace, dict[str, str]]:
    """The environment of a TPU launch added to ``current_env`` (bf16 and downcast settings).

    Args:
        *args: The parsed arguments of `accel launch`.
        current_env: The environment to add to.
        pod: True for a TPU pod launch (several hosts).
    """
    env = dict(current_env)
    mixed = getattr(args, "mixed_precision", None)
    if mixed == "bf16":
        env["XLA_DOWNCAST_BF16" if getattr(args, "downcast_bf16", False) else "XLA_USE_BF16"] = "1"
    if getattr(args, "debug", False):
        env["ACCELERATE_DEBUG_MODE"] = "true"
    if pod:
        args.vm = getattr(args, "vm", None) or []
    return args, env


def prepare_sagemager_args_inputs(
    sagemaker_config: Any, args: argparse.Namespace
) -> tuple[dict[str, Any], dict[str, str] | None]:
    """Estimator keyword arguments and input channels of a SageMaker job (the documented name, typo included).

    Args:
        sagemaker_config: The SageMaker config.
        *args: The parsed arguments of `accel launch`.
    """
    from accel_launch.sagemaker import sagemaker_job_args

    plan = plan_from_args(args, machine=MachineInfo("cpu", 0, 1), config=sagemaker_config)
    return sagemaker_job_args(sagemaker_config, plan)


def convert_dict_to_env_variables(current_env: Mapping[str, str]) -> list[str]:
    """``KEY=VALUE\\n`` lines of ``current_env`` for a ``.deepspeed_env`` file, in input order; an entry
    that is empty or contains ``;``, ``<``, ``>``, a space or a newline is dropped with a logged warning.

    Args:
        current_env: The environment to add to.
    """
    return [line + "\n" for line in env_file_lines(current_env)]


class PrepareForLaunch:
    """Wrap ``launcher`` so that the process spawned with index ``i`` sets its rank variables first.

    ``distributed_type`` "XLA" leaves the ranks to torch_xla; ``debug`` runs one machine whose world is
    ``WORLD_SIZE`` processes (what ``debug_launcher`` uses).

    Args:
        launcher: The function each spawned process runs.
        distributed_type: The kind of run; `XLA` leaves the rank variables to torch_xla.
        debug: Turn on accel's debug mode in the processes.
    """

    def __init__(self, launcher: Any, distributed_type: str = "NO", debug: bool = False) -> None:
        self.launcher = launcher
        self.distributed_type = str(getattr(distributed_type, "value", distributed_type))
        self.debug = debug

    def __call__(self, index: int, *args: Any) -> Any:
        if self.distributed_type != "XLA":
            nproc = int(
                os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("NPROC") or os.environ.get("WORLD_SIZE", "1")
            )
            node_rank = 0 if self.debug else int(os.environ.get("NODE_RANK", "0"))
            os.environ["LOCAL_RANK"] = str(index)
            os.environ["LOCAL_WORLD_SIZE"] = str(nproc)
            os.environ["RANK"] = str(node_rank * nproc + index)
            os.environ.setdefault("WORLD_SIZE", str(nproc))
        os.environ["FORK_LAUNCHED"] = "1"
        return self.launcher(*args)
