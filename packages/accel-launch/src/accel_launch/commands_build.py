"""Command lines built from a launch plan: the script, torch.distributed.run, DeepSpeed, mpirun.

Pure functions returning lists of strings, so each launcher's command is unit-tested without the
launcher (DeepSpeed need not be installed to test its command).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from accel_launch.plan import LaunchPlan
from accel_launch.values import ConfigError


def script_command(plan: LaunchPlan, python: str | None = None) -> list[str]:
    """How one process runs the script: ``python script args``, ``python -m module args`` or ``program args``."""
    args = list(plan.training_script_args)
    if plan.values.get("no_python"):
        return [plan.training_script, *args]
    python = python or sys.executable
    if plan.values.get("module"):
        return [python, "-m", plan.training_script, *args]
    return [python, plan.training_script, *args]


def rendezvous_address(plan: LaunchPlan, port: int) -> str:
    return f"{plan.main_process_ip or '127.0.0.1'}:{port}"


def rendezvous_backend(plan: LaunchPlan) -> str:
    """The rendezvous the workers meet through: the configured one, except that a run that may restart
    (``--max_restarts`` above 0) uses ``c10d`` instead of ``static``.

    Static rendezvous keeps one TCP store for every attempt, so a restarted group can read the
    addresses its dead predecessors published and fail with "Connection refused" (or hang); and on
    several machines a static group restarted on one machine is never joined by the others. c10d
    rendezvous runs a new round on every restart, on every machine.
    """
    backend = str(plan.values.get("rdzv_backend") or "static")
    if backend == "static" and int(plan.values.get("max_restarts") or 0) > 0:
        return "c10d"
    return backend


def restart_environment(plan: LaunchPlan) -> dict[str, str]:
    """Variables the elastic agent needs so that restarts work every time.

    With c10d rendezvous and restarts, each round gets a fresh store for the workers (hosted by
    worker rank 0 on a new port; on one machine by the launcher, on loopback, see
    ``process_guard.worker_stores_on_loopback``) instead of the agent's long-lived one, whose keys
    from the previous attempt would otherwise be read by the new one. A value the user set is kept.
    """
    if rendezvous_backend(plan) == "static" or int(plan.values.get("max_restarts") or 0) == 0:
        return {}
    return {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def torchrun_args(plan: LaunchPlan, port: int) -> list[str]:
    """Arguments of ``torch.distributed.run`` (everything after ``torchrun``) for ``plan``."""
    values = plan.values
    args = [
        "--nnodes",
        str(plan.num_machines),
        "--nproc_per_node",
        str(plan.nproc_per_node),
        "--max_restarts",
        str(values["max_restarts"]),
        "--monitor_interval",
        str(values["monitor_interval"]),
        "--role",
        str(values["role"]),
    ]
    backend = rendezvous_backend(plan)
    if backend == "static":
        args += [
            "--node_rank",
            str(plan.machine_rank),
            "--master_addr",
            plan.main_process_ip or "127.0.0.1",
            "--master_port",
            str(port),
        ]
    else:
        args += ["--rdzv_backend", backend, "--rdzv_endpoint", rendezvous_address(plan, port)]
    if values.get("rdzv_conf"):
        args += ["--rdzv_conf", str(values["rdzv_conf"])]
    if values.get("tee") not in (None, "0"):
        args += ["--tee", str(values["tee"])]
    if values.get("log_dir"):
        args += ["--log_dir", str(values["log_dir"])]
    if values.get("module"):
        args.append("--module")
    elif values.get("no_python"):
        args.append("--no_python")
    return [*args, plan.training_script, *plan.training_script_args]


def deepspeed_command(plan: LaunchPlan, port: int) -> list[str]:
    """The ``deepspeed`` launcher command of a multi-node DeepSpeed run."""
    values = plan.values
    cmd = ["deepspeed"]
    if values.get("deepspeed_hostfile"):
        cmd += ["--hostfile", str(values["deepspeed_hostfile"])]
    if values.get("deepspeed_inclusion_filter"):
        cmd += ["--include", str(values["deepspeed_inclusion_filter"])]
    if values.get("deepspeed_exclusion_filter"):
        cmd += ["--exclude", str(values["deepspeed_exclusion_filter"])]
    launcher = values.get("deepspeed_multinode_launcher") or "pdsh"
    known = ("pdsh", "standard", "openmpi", "mvapich", "mpich", "impi", "slurm", "nossh")
    if launcher not in known:
        raise ConfigError(f"--deepspeed_multinode_launcher must be one of {', '.join(known)}; got {launcher!r}")
    cmd += [
        "--num_nodes",
        str(plan.num_machines),
        "--num_gpus",
        str(plan.nproc_per_node),
        "--master_addr",
        str(plan.main_process_ip),
        "--master_port",
        str(port),
        "--launcher",
        launcher,
    ]
    if launcher == "nossh":
        cmd += ["--node_rank", str(plan.machine_rank)]
    if values.get("module"):
        cmd.append("--module")
    elif values.get("no_python"):
        cmd.append("--no_python")
    return [*cmd, plan.training_script, *plan.training_script_args]


#: Characters that make a ``KEY=VALUE`` line unsafe for the shell of a remote node.
ENV_FILE_FORBIDDEN = (";", "\n", "<", ">", " ")


def env_file_lines(env: Mapping[str, str]) -> list[str]:
    """``KEY=VALUE`` lines of ``env`` in input order; an entry that is empty or holds one of
    `ENV_FILE_FORBIDDEN` is left out with a logged warning."""
    import logging

    lines: list[str] = []
    for key, value in env.items():
        text = f"{key}{value}"
        if key and value and not any(char in text for char in ENV_FILE_FORBIDDEN):
            lines.append(f"{key}={value}")
        else:
            logging.getLogger(__name__).warning(
                "Skipping %s=%r: an environment file entry must be non-empty and free of ';', '<', '>', spaces "
                "and newlines",
                key,
                value,
            )
    return lines


def deepspeed_env_file_lines(env: Mapping[str, str]) -> list[str]:
    """Lines of the ``.deepspeed_env`` file through which pdsh hands the variables to remote nodes."""
    return env_file_lines(env)


#: (program, hostfile flag, process-count flag, per-node flag, bind flag) of Intel MPI / MVAPICH / MPICH.
MPI_INTEL_SPELLING = ("mpirun", "-f", "-n", "-ppn", "")


def mpirun_command(plan: LaunchPlan, spelling: tuple[str, str, str, str, str] = MPI_INTEL_SPELLING) -> list[str]:
    """The ``mpirun`` prefix of a multi-CPU run started by MPI, with the flag names of ``spelling``
    (see `accel_launch.launch_utils.mpirun_spelling()`; Intel MPI / MPICH by default)."""
    program, hostfile_flag, count_flag, per_node_flag, _bind = spelling
    hostfile = plan.values["mpirun_hostfile"]
    return [
        program,
        hostfile_flag,
        str(hostfile),
        per_node_flag,
        str(plan.nproc_per_node),
        count_flag,
        str(plan.num_processes),
    ]
