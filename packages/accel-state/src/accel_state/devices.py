"""Which device type this process runs on, and which backend and distributed type go with it."""

from __future__ import annotations

import os

from accel_state import imports
from accel_state.enums import DistributedType

#: Collective backend for each device type (the documented defaults).
BACKEND_BY_DEVICE = {
    "cuda": "nccl",
    "cpu": "gloo",
    "xpu": "xccl",
    "npu": "hccl",
    "hpu": "hccl",
    "mlu": "cncl",
    "musa": "mccl",
    "sdaa": "tccl",
    "mps": "gloo",
}

#: Distributed type for a multi-process run on each device type.
MULTI_TYPE_BY_DEVICE = {
    "cuda": DistributedType.MULTI_GPU,
    "cpu": DistributedType.MULTI_CPU,
    "xpu": DistributedType.MULTI_XPU,
    "npu": DistributedType.MULTI_NPU,
    "hpu": DistributedType.MULTI_HPU,
    "mlu": DistributedType.MULTI_MLU,
    "musa": DistributedType.MULTI_MUSA,
    "sdaa": DistributedType.MULTI_SDAA,
    "mps": DistributedType.MULTI_CPU,
}


def parse_device(text: str) -> tuple[str, int | None]:
    """Split a device string (``"cuda"``, ``"cuda:1"``) into its type and index (``None`` when absent).

    Raises:
        ValueError: the text is empty or its index is not a non-negative integer.
    """
    device_type, sep, index = text.strip().partition(":")
    if not device_type or (sep and not index.isdigit()):
        raise ValueError(
            f"ACCELERATE_TORCH_DEVICE={text!r} is not a device: expected a type with an optional index, "
            "like 'cuda' or 'cuda:1'"
        )
    return device_type, int(index) if sep else None


def forced_device_index(cpu: bool = False) -> int | None:
    """The device index ``ACCELERATE_TORCH_DEVICE`` pins (``cuda:1`` gives 1), or ``None``."""
    forced = os.environ.get("ACCELERATE_TORCH_DEVICE")
    if cpu or not forced:
        return None
    return parse_device(forced)[1]


def pick_device_index(device_type: str, local_rank: int, count: int, forced_index: int | None = None) -> int | None:
    """The index of the device this process uses.

    A pinned index (``ACCELERATE_TORCH_DEVICE=cuda:1``) wins; otherwise each process takes the device
    of its local rank, modulo the number of devices. cpu and mps have no index unless one is pinned.
    """
    if forced_index is not None:
        return forced_index
    if device_type in ("cpu", "mps"):
        return None
    return local_rank % count if count else 0


def detect_device_type(cpu: bool = False) -> str:
    """The device type to run on: ``ACCELERATE_TORCH_DEVICE``, else ``xla`` when torch_xla is installed and
    ``USE_TORCH_XLA`` is not false (found without importing it), else the first accelerator found, else cpu."""
    if cpu:
        return "cpu"
    forced = os.environ.get("ACCELERATE_TORCH_DEVICE")
    if forced:
        return parse_device(forced)[0]
    if imports.is_torch_xla_available():
        return "xla"
    if imports.is_cuda_available():
        return "cuda"
    if imports.is_mps_available():
        return "mps"
    if imports.is_xpu_available():
        return "xpu"
    if imports.is_npu_available():
        return "npu"
    if imports.is_mlu_available():
        return "mlu"
    if imports.is_musa_available():
        return "musa"
    if imports.is_sdaa_available():
        return "sdaa"
    if imports.is_hpu_available():
        return "hpu"
    return "cpu"


def device_count(device_type: str) -> int:
    """Number of devices of ``device_type`` visible to this process (1 for cpu, mps and xla: torch_xla
    gives each process one device)."""
    if device_type in ("cpu", "mps", "xla"):
        return 1
    import torch

    module = getattr(torch, device_type, None)
    return int(module.device_count()) if module is not None else 1


def backend_for(device_type: str, requested: str | None = None) -> str:
    """The collective backend: ``requested`` when given, else the default for ``device_type``."""
    if requested:
        return requested
    if device_type == "cpu" and imports.is_ccl_available() and os.environ.get("CCL_WORKER_COUNT"):
        return "ccl"
    return BACKEND_BY_DEVICE.get(device_type, "gloo")
