"""``notebook_launcher`` and ``debug_launcher``: run a function in several processes from Python.

``notebook_launcher`` starts the function under torch's elastic agent (processes forked from this
one, so functions defined in a notebook work), on the GPUs of the machine or, without any, as CPU
processes talking through gloo. ``debug_launcher`` always uses CPU processes and gloo.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from accel_launch.launch_utils import PrepareForLaunch
from accel_launch.runner import free_port, is_port_in_use


def _in_tpu_notebook() -> bool:
    from accel_state.imports import is_torch_xla_available

    return ("COLAB_TPU_ADDR" in os.environ or "TPU_NAME" in os.environ) and is_torch_xla_available()


def _check_not_initialized() -> None:
    import torch

    if torch.cuda.is_initialized():
        raise RuntimeError(
            "CUDA has been initialized in this process before notebook_launcher: restart the notebook and make "
            "sure no cell uses torch.cuda (or moves a tensor to the GPU) before the launch."
        )
    from accel_state.state import PartialState

    if PartialState._shared_state and PartialState().num_processes > 1:  # type: ignore[attr-defined]
        raise ValueError(
            "a distributed state already exists in this process: create the Accelerator inside the launched "
            "function, not before calling notebook_launcher"
        )


def notebook_launcher(
    function: Callable[..., Any],
    args: tuple = (),
    num_processes: int | None = None,
    mixed_precision: str = "no",
    use_port: str | int = "29500",
    master_addr: str = "127.0.0.1",
    node_rank: int = 0,
    num_nodes: int = 1,
    rdzv_backend: str = "static",
    rdzv_endpoint: str = "",
    rdzv_conf: dict[str, str] | None = None,
    rdzv_id: str = "none",
    max_restarts: int = 0,
    monitor_interval: float = 0.1,
    log_line_prefix_template: str | None = None,
) -> None:
    """Run ``function(*args)`` in ``num_processes`` processes per node (TPU cores, GPUs, or CPU processes).

    With one process (or ``num_processes=None`` on a machine with at most one device) the function runs
    here. ``num_nodes > 1``: call it on every node with its ``node_rank`` and the same ``master_addr``.

    Args:
        function: The function to run in each process.
        *args: Positional arguments of `function`.
        num_processes: Number of processes per machine; `None` uses every GPU / TPU core (one process on CPU).
        mixed_precision: `no`, `fp16` or `bf16`, set for the processes.
        use_port: Port of the rendezvous on the main machine.
        master_addr: Address of the main machine.
        node_rank: Rank of this machine among `num_nodes`.
        num_nodes: Number of machines.
        rdzv_backend: Rendezvous backend of `torch.distributed` (`static` or `c10d`).
        rdzv_endpoint: `host:port` of the rendezvous (with `c10d`).
        rdzv_conf: Extra rendezvous settings.
        rdzv_id: Identifier of the job, shared by all its machines.
        max_restarts: How many times the group is restarted after a process fails.
        monitor_interval: Seconds between checks of the processes' state.
        log_line_prefix_template: Prefix of each output line (torch's template, for example `[{rank}]:`).
    """
    mixed_precision = str(mixed_precision).lower()
    from accel_state.enums import MIXED_PRECISION_CHOICES

    if mixed_precision not in MIXED_PRECISION_CHOICES:
        choices = ", ".join(repr(choice) for choice in MIXED_PRECISION_CHOICES)
        raise ValueError(f"mixed_precision must be one of {choices}; got {mixed_precision!r}")
    if num_processes is not None and num_processes < 1:
        raise ValueError(f"num_processes must be at least 1, got {num_processes}")
    if num_nodes < 1 or not 0 <= node_rank < num_nodes:
        raise ValueError(f"node_rank must be between 0 and num_nodes - 1 ({num_nodes - 1}), got {node_rank}")

    if _in_tpu_notebook():
        import torch_xla.distributed.xla_multiprocessing as xmp

        print(f"Launching a training on {num_processes or 8} TPU cores.")
        xmp.spawn(PrepareForLaunch(function, distributed_type="XLA"), args=args, start_method="fork")
        return

    from accel_launch.machine import detect_machine

    machine = detect_machine()
    if num_processes is None:
        num_processes = machine.num_devices if machine.has_accelerator else 1
    use_cpu = not machine.has_accelerator
    if num_processes == 1 and num_nodes == 1:
        where = "CPU" if use_cpu else f"one {machine.device.upper()}"
        print(f"Launching training on {where}.")
        with _patched({"ACCELERATE_MIXED_PRECISION": mixed_precision}):
            function(*args)
        return

    _check_not_initialized()
    port = int(use_port)
    if rdzv_backend == "static" and node_rank == 0 and not rdzv_endpoint and is_port_in_use(port):
        raise ConnectionError(
            f"port {port} is already in use: pass another `use_port` to notebook_launcher (for example {free_port()})"
        )
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    restart_env: dict[str, str] = {}
    if max_restarts > 0:
        # Static rendezvous keeps one store across attempts (restarted workers would read the dead
        # ones' addresses): a restartable run meets through c10d, with a fresh worker store per round.
        rdzv_backend = "c10d" if rdzv_backend == "static" else rdzv_backend
        restart_env = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": os.environ.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")}
    configs: dict[str, Any] = dict(rdzv_conf or {})
    if rdzv_backend == "static":
        configs["rank"] = node_rank
    config = LaunchConfig(
        min_nodes=num_nodes,
        max_nodes=num_nodes,
        nproc_per_node=num_processes,
        run_id=rdzv_id,
        rdzv_endpoint=rdzv_endpoint or f"{master_addr}:{port}",
        rdzv_backend=rdzv_backend,
        rdzv_configs=configs,
        max_restarts=max_restarts,
        monitor_interval=monitor_interval,
        start_method="fork",
        log_line_prefix_template=log_line_prefix_template,
    )
    kind = "CPU processes" if use_cpu else f"{machine.device.upper()}s"
    print(f"Launching training on {num_processes} {kind}.")
    env = {
        "ACCELERATE_MIXED_PRECISION": mixed_precision,
        "ACCELERATE_USE_CPU": "true" if use_cpu else "false",
        **restart_env,
    }
    if use_cpu:
        env.setdefault("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    with _patched(env):
        elastic_launch(config, entrypoint=function)(*args)


def debug_launcher(function: Callable[..., Any], args: tuple = (), num_processes: int = 2) -> None:
    """Run ``function(*args)`` in ``num_processes`` CPU processes (gloo) on this machine, to debug distributed code.

    Args:
        function: The function to run in each process.
        *args: Positional arguments of `function`.
        num_processes: Number of CPU processes.
    """
    if num_processes < 1:
        raise ValueError(f"num_processes must be at least 1, got {num_processes}")
    from torch.multiprocessing import start_processes

    env = {
        "WORLD_SIZE": str(num_processes),
        "LOCAL_WORLD_SIZE": str(num_processes),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "ACCELERATE_MIXED_PRECISION": "no",
        "ACCELERATE_USE_CPU": "true",
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    }
    with _patched(env):
        start_processes(PrepareForLaunch(function, debug=True), args=args, nprocs=num_processes, start_method="fork")


class _patched:
    """Set environment variables for a block and restore the previous values afterwards."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values = values
        self.saved: dict[str, str | None] = {}

    def __enter__(self) -> None:
        for key, value in self.values.items():
            self.saved[key] = os.environ.get(key)
            os.environ[key] = value

    def __exit__(self, *exc: object) -> None:
        for key, value in self.saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        sys.stdout.flush()
