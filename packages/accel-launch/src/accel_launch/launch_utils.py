"""Launch utilities (documented as ``accel.utils.launch``): the command and environment of each launcher.

They take the ``argparse.Namespace`` of ``accel launch`` (flags not given are ``None``) and return
what the launcher would run; ``PrepareForLaunch`` wraps a function so that each spawned process knows
its rank. Nothing here imports torch at module level.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from accel_launch.commands_build import deepspeed_command, deepspeed_env_file_lines, script_command, torchrun_args
from accel_launch.options import OPTIONS
from accel_launch.plan import LaunchPlan, MachineInfo, resolve
from accel_launch.runner import free_port, is_port_in_use

__all__ = [
    "PrepareForLaunch",
    "convert_dict_to_env_variables",
    "free_port",
    "is_port_in_use",
    "prepare_deepspeed_cmd_env",
    "prepare_multi_gpu_env",
    "prepare_sagemager_args_inputs",
    "prepare_simple_launcher_cmd_env",
    "prepare_tpu",
]


def plan_from_args(args: argparse.Namespace, machine: MachineInfo | None = None, config: Any = None) -> LaunchPlan:
    """The launch plan of a parsed ``accel launch`` namespace (attributes left ``None`` are not given)."""
    flags = {opt.dest: getattr(args, opt.dest) for opt in OPTIONS if getattr(args, opt.dest, None) is not None}
    if machine is None:
        from accel_launch.machine import cpu_machine, detect_machine

        machine = cpu_machine() if flags.get("cpu") else detect_machine()
    script_args = getattr(args, "training_script_args", None) or []
    return resolve(flags, config, machine, getattr(args, "training_script", ""), script_args)


def prepare_simple_launcher_cmd_env(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """Command and full environment of a one-process launch."""
    plan = plan_from_args(args)
    return script_command(plan), {**os.environ, **plan.env}


def prepare_multi_gpu_env(args: argparse.Namespace) -> dict[str, str]:
    """Full environment of a torch.distributed.run launch (the torchrun arguments under ``ACCEL_TORCHRUN_ARGS``)."""
    plan = plan_from_args(args)
    port = plan.main_process_port or 29500
    env = {**os.environ, **plan.env}
    env["ACCEL_TORCHRUN_ARGS"] = " ".join(torchrun_args(plan, port))
    return env


def prepare_deepspeed_cmd_env(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """The ``deepspeed`` command and full environment of a multi-node DeepSpeed launch."""
    plan = plan_from_args(args)
    return deepspeed_command(plan, plan.main_process_port or 29500), {**os.environ, **plan.env}


def prepare_tpu(
    args: argparse.Namespace, current_env: dict[str, str], pod: bool = False
) -> tuple[argparse.Namespace, dict[str, str]]:
    """The environment of a TPU launch added to ``current_env`` (bf16 and downcast settings)."""
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
    """Estimator keyword arguments and input channels of a SageMaker job (the documented name, typo included)."""
    from accel_launch.sagemaker import sagemaker_job_args

    plan = plan_from_args(args, machine=MachineInfo("cpu", 0, 1), config=sagemaker_config)
    return sagemaker_job_args(sagemaker_config, plan)


def convert_dict_to_env_variables(current_env: dict[str, str]) -> list[str]:
    """``KEY=VALUE`` lines of ``current_env`` for a ``.deepspeed_env`` file (values with newlines skipped)."""
    return [line + "\n" for line in deepspeed_env_file_lines(current_env)]


class PrepareForLaunch:
    """Wrap ``launcher`` so that the process spawned with index ``i`` sets its rank variables first.

    ``distributed_type`` "XLA" leaves the ranks to torch_xla; ``debug`` runs one machine whose world is
    ``WORLD_SIZE`` processes (what ``debug_launcher`` uses).
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
