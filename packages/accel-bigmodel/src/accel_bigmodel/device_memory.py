"""How much memory each device has free right now (the only planning input that queries hardware)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch

from accel_bigmodel.planning import DeviceKey, normalize_max_memory
from accel_bigmodel.sizes import parse_size
from accel_state.imports import is_psutil_available


def available_cpu_memory() -> int:
    """Bytes of RAM available to new allocations (psutil when installed, else /proc/meminfo or sysconf)."""
    if is_psutil_available():
        import psutil

        return int(psutil.virtual_memory().available)
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def _accelerator_free() -> dict[DeviceKey, int]:
    free: dict[DeviceKey, int] = {}
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            try:
                free[index] = int(torch.cuda.mem_get_info(index)[0])
            except RuntimeError:
                free[index] = 0
    elif hasattr(torch, "xpu") and torch.xpu.is_available():
        for index in range(torch.xpu.device_count()):
            props = torch.xpu.get_device_properties(index)
            free[index] = int(props.total_memory - torch.xpu.memory_reserved(index))
    elif torch.backends.mps.is_available():
        free["mps"] = available_cpu_memory()
    return free


def get_max_memory(max_memory: Mapping[Any, int | float | str] | None = None) -> dict[DeviceKey, int]:
    """Free memory per device in bytes (accelerators first, then "cpu"), or ``max_memory`` validated and in bytes.

    As documented, a ``max_memory`` dict given here is also converted in place (sizes like "10GiB" and
    fractional byte counts become ints), since callers read it back after the call.

    Args:
        max_memory: Budgets to validate and convert to bytes; `None` measures free memory.
    """
    if max_memory is None:
        result = _accelerator_free()
        result["cpu"] = available_cpu_memory()
        return result
    budgets = normalize_max_memory(max_memory)  # type: ignore[arg-type]  # floats are parsed too
    if isinstance(max_memory, dict):
        for key, value in list(max_memory.items()):
            if isinstance(value, (str, float)):
                max_memory[key] = parse_size(value)
    indices = [d for d in budgets if isinstance(d, int)]
    if indices:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if hasattr(torch, "xpu") and torch.xpu.is_available():
            count = torch.xpu.device_count()
        bad = [d for d in indices if d >= count]
        if bad:
            raise ValueError(
                f"max_memory names accelerator indices {bad} but this machine has {count} "
                f"({list(range(count))} are valid); use 'cpu' and 'disk' for the rest."
            )
    return budgets
