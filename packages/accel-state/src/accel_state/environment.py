"""Reading and temporarily changing environment variables (no torch import here)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

_TRUE = {"y", "yes", "t", "true", "on", "1"}
_FALSE = {"n", "no", "f", "false", "off", "0"}


def str_to_bool(value: str, to_bool: bool = False) -> int | bool:
    """``1``/``0`` (or ``True``/``False`` with ``to_bool``) for the usual spellings of yes and no.

    Args:
        value: The text (`yes`, `true`, `1`, `on`, `no`, `false`, `0`, `off`, any case).
        to_bool: Return a `bool` rather than `1` / `0`.
    """
    text = str(value).strip().lower()
    if text in _TRUE:
        return True if to_bool else 1
    if text in _FALSE:
        return False if to_bool else 0
    raise ValueError(f"invalid truth value {value!r}: use one of {sorted(_TRUE | _FALSE)}")


def parse_flag_from_env(key: str, default: bool = False) -> bool:
    """Boolean value of the environment variable ``key``, ``default`` when unset.

    Args:
        key: Name of the environment variable.
        default: The value when the variable is unset.
    """
    value = os.environ.get(key, str(default))
    return bool(str_to_bool(value)) if value != "" else default


def parse_choice_from_env(key: str, default: str = "no") -> str:
    """String value of the environment variable ``key``, ``default`` when unset.

    Args:
        key: Name of the environment variable.
        default: The value returned when the variable is unset.
    """
    return os.environ.get(key, str(default))


def get_int_from_env(env_keys: list[str] | tuple[str, ...], default: int) -> int:
    """The first non-negative integer found among ``env_keys``, else ``default``.

    Args:
        env_keys: Names of the variables, tried in order.
        default: The value when none of them holds a non-negative integer.
    """
    for key in env_keys:
        raw = os.environ.get(key)
        if raw is None or raw == "":
            continue
        try:
            value = int(raw)
        except ValueError:
            raise ValueError(f"environment variable {key}={raw!r} must be an integer") from None
        if value >= 0:
            return value
    return default


@contextlib.contextmanager
def patch_environment(**kwargs: Any) -> Iterator[None]:
    """Set environment variables (keys upper-cased) for the duration of the block, then restore them.

    Args:
        **kwargs: Variables to set, as `NAME=value` (names are upper-cased, values turned into strings).
    """
    saved: dict[str, str | None] = {}
    for key, value in kwargs.items():
        name = key.upper()
        saved[name] = os.environ.get(name)
        os.environ[name] = str(value)
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


@contextlib.contextmanager
def clear_environment() -> Iterator[None]:
    """Empty ``os.environ`` for the duration of the block, then restore it exactly."""
    saved = dict(os.environ)
    os.environ.clear()
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def are_libraries_initialized(*library_names: str) -> list[str]:
    """Those of ``library_names`` that are already imported in this process.

    Args:
        library_names: Import names of the libraries to look for.
    """
    import sys

    return [name for name in library_names if name in sys.modules]


def get_cpu_distributed_information() -> dict[str, int]:
    """Rank, world size, local rank and local world size of a CPU run, from the common launcher variables."""
    return {
        "rank": get_int_from_env(["RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK"], 0),
        "world_size": get_int_from_env(["WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE"], 1),
        "local_rank": get_int_from_env(
            ["LOCAL_RANK", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_RANK"], 0
        ),
        "local_world_size": get_int_from_env(
            ["LOCAL_WORLD_SIZE", "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "MV2_COMM_WORLD_LOCAL_SIZE"], 1
        ),
    }


_PURGE_MARK = "_accel_purges_environment"


def purge_accelerate_environment(func_or_cls: Any) -> Any:
    """Decorator: the ``ACCELERATE_*`` variables that the decorated function sets or changes are put back
    as they were when it returns or raises.

    On a class, every ``test*`` method is wrapped, the inherited ones included, and so are the
    ``test*`` methods of every subclass defined later (through ``__init_subclass__``), so decorating a
    base test class cleans all the tests derived from it.

    Args:
        func_or_cls: a function, or a (test) class.

    Returns:
        The wrapped function, or the class itself with its test methods wrapped.
    """
    import functools
    import inspect

    def wrap(function: Any) -> Any:
        if getattr(function, _PURGE_MARK, False):
            return function

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            before = {k: v for k, v in os.environ.items() if k.startswith("ACCELERATE_")}
            try:
                return function(*args, **kwargs)
            finally:
                for key in [k for k in os.environ if k.startswith("ACCELERATE_")]:
                    if key not in before:
                        del os.environ[key]
                os.environ.update(before)

        setattr(wrapper, _PURGE_MARK, True)
        return wrapper

    if not inspect.isclass(func_or_cls):
        return wrap(func_or_cls)

    def wrap_tests(cls: type) -> None:
        for name in dir(cls):
            if not name.startswith("test"):
                continue
            member = inspect.getattr_static(cls, name)
            if isinstance(member, (staticmethod, classmethod)):
                setattr(cls, name, type(member)(wrap(member.__func__)))
            elif inspect.isfunction(member):
                setattr(cls, name, wrap(member))

    wrap_tests(func_or_cls)
    previous = func_or_cls.__dict__.get("__init_subclass__")

    def __init_subclass__(cls: type, **kwargs: Any) -> None:
        if previous is not None:
            previous.__get__(None, cls)(**kwargs)
        else:
            super(func_or_cls, cls).__init_subclass__(**kwargs)  # type: ignore[misc]
        wrap_tests(cls)

    func_or_cls.__init_subclass__ = classmethod(__init_subclass__)  # type: ignore[assignment]
    return func_or_cls


def get_current_device_type() -> tuple[str, str]:
    """(torch device type, distributed-type suffix) of the accelerator this machine uses:
    ``("cuda", "GPU")``, ``("xpu", "XPU")``, ... or ``("cpu", "CPU")``."""
    from accel_state import imports

    if imports.is_torch_xla_available():
        return "xla", "XLA"
    for device, check in (
        ("mlu", imports.is_mlu_available),
        ("sdaa", imports.is_sdaa_available),
        ("musa", imports.is_musa_available),
        ("npu", imports.is_npu_available),
        ("hpu", imports.is_hpu_available),
        ("xpu", imports.is_xpu_available),
    ):
        if check():
            return device, device.upper()
    if imports.is_cuda_available():
        return "cuda", "GPU"
    if imports.is_mps_available():
        return "mps", "MPS"
    return "cpu", "CPU"


def get_gpu_info() -> tuple[list[str], int]:
    """(names of the NVIDIA GPUs, their count), from ``nvidia-smi``; ([], 0) where there is none."""
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    if smi is None:
        return [], 0
    try:
        out = subprocess.run(
            [smi, "--query-gpu=gpu_name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return [], 0
    names = [line.strip() for line in out.splitlines() if line.strip()]
    return names, len(names)


def check_cuda_p2p_ib_support() -> bool:
    """False on NVIDIA consumer GPUs (RTX 3090 / 4000 series) with several GPUs and a driver before
    550, where peer-to-peer and InfiniBand must be disabled (``NCCL_P2P_DISABLE=1``,
    ``NCCL_IB_DISABLE=1``); True otherwise."""
    import shutil
    import subprocess

    names, count = get_gpu_info()
    unsupported = ("RTX 3090", "RTX 40")
    if count <= 1 or not any(marker in name for name in names for marker in unsupported):
        return True
    smi = shutil.which("nvidia-smi")
    try:
        driver = subprocess.run(
            [smi or "nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.splitlines()[0]
        return int(driver.split(".")[0]) >= 550
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return False


def override_numa_affinity(local_process_index: int, verbose: bool | None = None) -> None:
    """Pin this process to the CPUs of the NUMA node of its GPU, recomputing the CPU set every call.

    Only NVIDIA GPUs report their NUMA node (through pynvml); on a machine without CUDA, or without
    ``os.sched_setaffinity`` (not Linux), there is nothing to pin and the call does nothing. Prefer
    `set_numa_affinity()`, which computes the set once per process index.

    Args:
        local_process_index: index of this process on its machine (the GPU it drives).
        verbose: log the CPUs chosen (default: ``ACCELERATE_DEBUG_MODE``).

    Raises:
        ImportError: CUDA is available but pynvml, which reads the GPU's CPU affinity, is not installed.
    """
    import logging
    import math

    from accel_state import imports
    from accel_state.install_hints import install_hint

    if not (imports.is_cuda_available() and hasattr(os, "sched_setaffinity")):
        return
    if not imports.is_pynvml_available():
        raise ImportError(
            "override_numa_affinity: to set the CPU affinity on CUDA GPUs the `pynvml` package must be "
            f"available (`{install_hint('pynvml')}`), to read which CPUs are near each GPU."
        )
    import pynvml  # type: ignore[import-not-found]

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(local_process_index)
    words = math.ceil((os.cpu_count() or 1) / 64)
    mask = pynvml.nvmlDeviceGetCpuAffinity(handle, words)
    cpus = [word_index * 64 + bit for word_index, word in enumerate(mask) for bit in range(64) if word >> bit & 1]
    if cpus:
        os.sched_setaffinity(0, cpus)
    if verbose or (verbose is None and parse_flag_from_env("ACCELERATE_DEBUG_MODE")):
        chosen = sorted(os.sched_getaffinity(0))
        logging.getLogger(__name__).info(
            "Assigning %d cpu cores to process %d: %s", len(chosen), local_process_index, chosen
        )


_NUMA_DONE: set[tuple[int, bool | None]] = set()


def set_numa_affinity(local_process_index: int, verbose: bool | None = None) -> None:
    """Pin this process to the CPUs of the NUMA node of its GPU (NVIDIA, Linux, with pynvml), once per
    ``(local_process_index, verbose)``: later calls do nothing (`override_numa_affinity()` recomputes).

    Args:
        local_process_index: index of this process on its machine.
        verbose: log the CPUs chosen (default: ``ACCELERATE_DEBUG_MODE``).

    Raises:
        ImportError: CUDA is available but pynvml is not installed.
    """
    key = (local_process_index, verbose)
    if key in _NUMA_DONE:
        return
    override_numa_affinity(local_process_index, verbose=verbose)
    _NUMA_DONE.add(key)


#: Oldest Linux kernel on which multi-process runs are known not to hang.
MINIMUM_LINUX_KERNEL = "5.5.0"


def check_os_kernel(release: str | None = None, system: str | None = None) -> bool:
    """Warn (once per machine, as a log record and a warning) when the Linux kernel is older than
    `MINIMUM_LINUX_KERNEL`, where processes can hang; True when it is (``release`` and ``system``
    default to this machine's, from `platform.uname()`).

    Args:
        release: Kernel release to check (as `platform.release()` gives it); `None` reads this machine's.
        system: Operating system name (as `platform.system()`); `None` reads this machine's.
    """
    import logging
    import platform
    import re
    import warnings

    if release is None or system is None:
        info = platform.uname()
        release = info.release if release is None else release
        system = info.system if system is None else system
    if system != "Linux":
        return False
    found = re.search(r"(\d+)\.(\d+)\.(\d+)", release)
    if found is None:
        return False
    version = tuple(int(part) for part in found.groups())
    minimum = tuple(int(part) for part in MINIMUM_LINUX_KERNEL.split("."))
    if version >= minimum:
        return False
    text = ".".join(found.groups())
    message = (
        f"Linux kernel {text} is older than {MINIMUM_LINUX_KERNEL}, the oldest on which multi-process runs are "
        f"known not to hang; upgrade the kernel to {MINIMUM_LINUX_KERNEL} or newer."
    )
    local_rank = os.environ.get("LOCAL_RANK", "0")
    if local_rank in ("", "0"):
        logging.getLogger(__name__).warning(message)
        warnings.warn(message, stacklevel=2)
    return True
