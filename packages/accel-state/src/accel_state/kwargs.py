"""Kwargs handlers: small dataclasses that customise one object accel builds for the user."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any


@contextlib.contextmanager
def without_launcher_variables() -> Iterator[None]:
    """Hide the launcher's variables (``ACCELERATE_*``, ``FSDP_*`` and the rest of `env_vars`) for
    the duration of the block, then put them back."""
    from accel_state.env_vars import ENV_VARS

    hidden = {
        key: value for key, value in os.environ.items() if key in ENV_VARS or key.startswith(("ACCELERATE_", "FSDP_"))
    }
    for key in hidden:
        del os.environ[key]
    try:
        yield
    finally:
        os.environ.update(hidden)


class KwargsHandler:
    """Base of the kwargs handlers: ``to_kwargs()`` returns only the fields changed from their defaults."""

    def to_dict(self) -> dict[str, Any]:
        """Every field, as a plain dict."""
        return copy.deepcopy(self.__dict__)

    def to_kwargs(self) -> dict[str, Any]:
        """The fields whose value differs from the default of the class.

        The defaults are those of a handler built without the launcher's variables, so a value that
        came from the environment (``ACCELERATE_DYNAMO_BACKEND``, say) counts as a change.
        """
        with without_launcher_variables():
            default = self.__class__().to_dict()
        return {key: value for key, value in self.to_dict().items() if default.get(key) != value}


_BACKENDS = ("nccl", "gloo", "mpi", "ccl", "xccl", "hccl", "cncl", "mccl", "tccl", "smddp", "xla", "cpu:gloo,cuda:nccl")


@dataclass
class InitProcessGroupKwargs(KwargsHandler):
    """Arguments for ``torch.distributed.init_process_group``: backend, init method and timeout.

    Args:
        backend: The `torch.distributed` backend (`nccl`, `gloo`, ...); `None` picks the one for the device.
        init_method: URL that tells the processes how to find each other; `None` uses the environment
            variables the launcher set.
        timeout: How long a collective may wait before failing (`datetime.timedelta`); `None` keeps torch's
            default.
    """

    backend: str | None = "nccl"
    init_method: str | None = None
    timeout: timedelta | None = None

    def __post_init__(self) -> None:
        if self.backend is not None and self.backend not in _BACKENDS:
            raise ValueError(f"InitProcessGroupKwargs.backend={self.backend!r} is not one of {_BACKENDS}")
        if self.timeout is not None and not isinstance(self.timeout, timedelta):
            if isinstance(self.timeout, (int, float)):
                self.timeout = timedelta(seconds=self.timeout)
            else:
                raise TypeError(
                    f"InitProcessGroupKwargs.timeout must be a datetime.timedelta or seconds, got {self.timeout!r}"
                )


def fields_of(obj: Any) -> list[str]:
    """Names of the dataclass fields of ``obj``."""
    return [f.name for f in dataclasses.fields(obj)]
