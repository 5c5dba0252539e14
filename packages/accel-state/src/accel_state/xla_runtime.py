"""torch_xla's view of this process: its device, how many replicas run and which one this is.

Read once, by `PartialState` when the run is on XLA (torch_xla installed, ``USE_TORCH_XLA`` not false,
no ``cpu=True``). torch_xla is imported here only, inside the function, so a machine without it never
loads this module's dependency.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["XLAProcess", "read_xla_process", "xla_rendezvous"]


@dataclass(frozen=True)
class XLAProcess:
    """This process under torch_xla's runtime (PJRT).

    Args:
        device: the ``torch.device`` torch_xla gives this process (``xla:0``).
        world_size: number of replicas (processes) in the run.
        process_index: this replica's global ordinal.
        local_process_index: this replica's ordinal on its host.
        local_world_size: replicas on this host.
    """

    device: Any
    world_size: int
    process_index: int
    local_process_index: int
    local_world_size: int


def read_xla_process() -> XLAProcess:
    """Ask torch_xla's runtime where this process is (imports torch_xla).

    Raises:
        ImportError: torch_xla cannot be imported (or its native part does not load with this torch).
    """
    import torch_xla  # type: ignore[import-not-found]
    import torch_xla.runtime as xr  # type: ignore[import-not-found]

    device = torch_xla.device() if hasattr(torch_xla, "device") else _legacy_device()
    world = int(xr.world_size())
    local_count = getattr(xr, "local_process_count", None)
    return XLAProcess(
        device=device,
        world_size=world,
        process_index=int(xr.global_ordinal()),
        local_process_index=int(xr.local_ordinal()),
        local_world_size=int(local_count()) if callable(local_count) else world,
    )


def _legacy_device() -> Any:
    import torch_xla.core.xla_model as xm  # type: ignore[import-not-found]

    return xm.xla_device()


def xla_rendezvous(tag: str) -> None:
    """Block until every replica reaches ``tag`` (``xm.rendezvous``)."""
    import torch_xla.core.xla_model as xm  # type: ignore[import-not-found]

    xm.rendezvous(tag)
