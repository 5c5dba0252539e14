"""The process group of a one-process FSDP run that a launcher started.

The documented system shards with FSDP even when one process was launched (``accelerate launch
--use_fsdp --num_processes 1``, or ``torchrun --nproc_per_node 1``): the launcher sets ``LOCAL_RANK``, so
its state starts a process group of one rank and FSDP wraps the model on a one-rank mesh (parameters
in the mixed-precision policy's dtype, the FSDP checkpoint layout). A plain ``python script.py`` sets no
``LOCAL_RANK``: there the documented system leaves FSDP out and so does accel (the model stays whole).

accel's state starts a group only for several processes, so the FSDP strategy starts this one itself:
rank 0 of 1 over an in-memory ``HashStore`` (no port, no network), gloo on the CPU (plus the device's
backend on an accelerator). Every collective of a one-rank group returns at once. The group is
destroyed at interpreter exit (as the state does for its own group), or by
`destroy_single_process_group()`.
"""

from __future__ import annotations

import atexit
import contextlib
import os
from typing import Any

__all__ = ["destroy_single_process_group", "launched", "start_single_process_group"]

#: The default group this module started (None when it started none or it was destroyed).
_STARTED: dict[str, Any] = {"group": None, "exit_hook": False}


def launched(environ: Any = None) -> bool:
    """Whether a launcher started this process (it set ``LOCAL_RANK``, as ``accel launch`` and torchrun do).

    Args:
        environ: The environment to read (default ``os.environ``).
    """
    environ = os.environ if environ is None else environ
    return str(environ.get("LOCAL_RANK", "")).strip() not in ("", "-1")


def _backend(device: Any) -> str:
    from accel_state.devices import backend_for

    if device.type == "cpu":
        return "gloo"
    # gloo for the CPU tensors of full state dicts and CPU offload, the device's backend for the rest.
    return f"cpu:gloo,{device.type}:{backend_for(device.type)}"


def start_single_process_group(device: Any) -> bool:
    """Start a default process group of one rank for ``device`` unless one exists; True when started here.

    Args:
        device: The run's ``torch.device`` (its type picks the backend: gloo on the CPU, gloo and the
            device's own backend, nccl on CUDA say, on an accelerator).
    """
    import torch.distributed as dist

    if not dist.is_available():
        raise RuntimeError(
            "FSDP needs torch.distributed, which this torch build lacks; install a torch with distributed support"
        )
    if dist.is_initialized():
        return False
    if device.type not in ("cpu", "meta") and device.index is not None:
        import torch

        getattr(torch, device.type).set_device(device)  # the device's backend binds to the current device
    dist.init_process_group(_backend(device), store=dist.HashStore(), rank=0, world_size=1)
    _STARTED["group"] = dist.group.WORLD
    if not _STARTED["exit_hook"]:
        atexit.register(_destroy_at_exit)
        _STARTED["exit_hook"] = True
    return True


def destroy_single_process_group() -> bool:
    """Destroy the group `start_single_process_group()` started, if it is still the default group;
    True when one was destroyed. A group started by anyone else is left alone."""
    import torch.distributed as dist

    ours = _STARTED["group"]
    _STARTED["group"] = None
    if ours is None or not (dist.is_available() and dist.is_initialized()) or dist.group.WORLD is not ours:
        return False
    dist.destroy_process_group()
    return True


def _destroy_at_exit() -> None:
    """Free the group while the interpreter is still whole (gloo's threads may abort it at finalisation)."""
    import gc

    gc.collect()
    with contextlib.suppress(Exception):
        destroy_single_process_group()
