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


def detect_device_type(cpu: bool = False) -> str:
    """The device type to run on: ``ACCELERATE_TORCH_DEVICE``, else the first accelerator found, else cpu."""
    if cpu:
        return "cpu"
    forced = os.environ.get("ACCELERATE_TORCH_DEVICE")
    if forced:
        return forced.split(":")[0]
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
    """Number of devices of ``device_type`` visible to this process (1 for cpu and mps)."""
    if device_type in ("cpu", "mps"):
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
