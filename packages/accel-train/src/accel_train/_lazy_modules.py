"""Stand-ins for modules that only checkpointing needs, imported on first attribute access.

``import accel_train.accelerator`` must stay cheap (``from accel import Accelerator`` costs little more
than ``import torch``); the checkpoint file formats load the first time a checkpoint is written or read.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


class _LazyModule:
    def __init__(self, name: str) -> None:
        self._name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attr: str) -> Any:
        if self._module is None:
            self._module = importlib.import_module(self._name)
        return getattr(self._module, attr)


checkpoint_file_io: Any = _LazyModule("accel_train.checkpoint.file_io")
checkpointing: Any = _LazyModule("accel_train.checkpointing")
preemption: Any = _LazyModule("accel_train.preemption")
