"""What this machine offers (accelerator type and count, CPU cores), asked once per launch.

Kept apart from the pure planning code: this is the one place of the launcher that may import torch
to count devices, and only when the flags and config leave the choice open.
"""

from __future__ import annotations

import os

from accel_launch.plan import MachineInfo


def cpu_cores() -> int:
    """CPU cores this process may use."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def detect_machine() -> MachineInfo:
    """The accelerator of this machine (cuda, xpu, npu, mlu, musa, hpu, mps or cpu) and how many there are."""
    from accel_state import imports

    cores = cpu_cores()
    if imports.is_cuda_available():
        import torch

        return MachineInfo("cuda", torch.cuda.device_count(), cores)
    for name in ("xpu", "npu", "mlu", "musa", "sdaa"):
        check = getattr(imports, f"is_{name}_available")
        if check():
            import torch

            module = getattr(torch, name, None)
            count = module.device_count() if module is not None and hasattr(module, "device_count") else 1
            return MachineInfo(name, count, cores)
    if imports.is_hpu_available():
        import torch

        return MachineInfo("hpu", torch.hpu.device_count(), cores)  # type: ignore[attr-defined]
    if imports.is_mps_available():
        return MachineInfo("mps", 1, cores)
    return MachineInfo("cpu", 0, cores)


def cpu_machine() -> MachineInfo:
    """This machine seen as CPU only (no device query: for --cpu runs)."""
    return MachineInfo("cpu", 0, cpu_cores())
