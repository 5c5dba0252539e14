"""Kwargs handlers: small dataclasses that customise one object accel builds for the user."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from datetime import timedelta
from typing import Any


class KwargsHandler:
    """Base of the kwargs handlers: ``to_kwargs()`` returns only the fields changed from their defaults."""

    def to_dict(self) -> dict[str, Any]:
        """Every field, as a plain dict."""
        return copy.deepcopy(self.__dict__)

    def to_kwargs(self) -> dict[str, Any]:
        """The fields whose value differs from the default of the class."""
        default = self.__class__().to_dict()
        return {key: value for key, value in self.to_dict().items() if default.get(key) != value}


_BACKENDS = ("nccl", "gloo", "mpi", "ccl", "xccl", "hccl", "cncl", "mccl", "tccl", "smddp", "xla", "cpu:gloo,cuda:nccl")


@dataclass
class InitProcessGroupKwargs(KwargsHandler):
    """Arguments for ``torch.distributed.init_process_group``: backend, init method and timeout."""

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
