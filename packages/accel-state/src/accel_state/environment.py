"""Reading and temporarily changing environment variables (no torch import here)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

_TRUE = {"y", "yes", "t", "true", "on", "1"}
_FALSE = {"n", "no", "f", "false", "off", "0"}


def str_to_bool(value: str, to_bool: bool = False) -> int | bool:
    """``1``/``0`` (or ``True``/``False`` with ``to_bool``) for the usual spellings of yes and no."""
    text = str(value).strip().lower()
    if text in _TRUE:
        return True if to_bool else 1
    if text in _FALSE:
        return False if to_bool else 0
    raise ValueError(f"invalid truth value {value!r}: use one of {sorted(_TRUE | _FALSE)}")


def parse_flag_from_env(key: str, default: bool = False) -> bool:
    """Boolean value of the environment variable ``key``, ``default`` when unset."""
    value = os.environ.get(key, str(default))
    return bool(str_to_bool(value)) if value != "" else default


def parse_choice_from_env(key: str, default: str = "no") -> str:
    """String value of the environment variable ``key``, ``default`` when unset."""
    return os.environ.get(key, str(default))


def get_int_from_env(env_keys: list[str] | tuple[str, ...], default: int) -> int:
    """The first non-negative integer found among ``env_keys``, else ``default``."""
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
    """Set environment variables (keys upper-cased) for the duration of the block, then restore them."""
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
    """Those of ``library_names`` that are already imported in this process."""
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


#: Oldest Linux kernel on which multi-process runs are known not to hang.
MINIMUM_LINUX_KERNEL = "5.5.0"


def check_os_kernel(release: str | None = None, system: str | None = None) -> bool:
    """Warn (once per machine, as a log record and a warning) when the Linux kernel is older than
    :data:`MINIMUM_LINUX_KERNEL`, where processes can hang; True when it is (``release`` and ``system``
    default to this machine's, from :func:`platform.uname`)."""
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
