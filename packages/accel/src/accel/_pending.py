"""Placeholders for documented FSDP and DeepSpeed utility names whose implementation has not landed yet.

Libraries written for the documented system import some of these at module level (transformers'
Trainer imports ``save_fsdp_model`` and friends, and ``accelerate.utils.deepspeed.HfDeepSpeedConfig``),
so the names must exist for those libraries to import at all. Each one fails when it is *used*, with
an error naming what is missing. The export tables of the owning package replace them (they are
registered first, so any real entry wins) as soon as the FSDP and DeepSpeed work provides them.
"""

from __future__ import annotations

from typing import Any, NoReturn

_DEEPSPEED = "DeepSpeed integration utilities"


def _missing(name: str, feature: str) -> NoReturn:
    raise NotImplementedError(
        f"accel.utils.{name} is not available yet: accel's {feature} have not landed in this version. "
        "Train without FSDP/DeepSpeed, or use a version of accel that provides them."
    )


class _PendingClass:
    """A class a library may subclass or test with ``isinstance``; creating one fails."""

    _feature = _DEEPSPEED

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _missing(type(self).__name__, self._feature)


class HfDeepSpeedConfig(_PendingClass):
    """Placeholder (DeepSpeed): creating one fails."""


class DummyOptim(_PendingClass):
    """Placeholder (DeepSpeed): creating one fails."""


class DummyScheduler(_PendingClass):
    """Placeholder (DeepSpeed): creating one fails."""


class DeepSpeedEngineWrapper(_PendingClass):
    """Placeholder (DeepSpeed): creating one fails."""


class DeepSpeedOptimizerWrapper(_PendingClass):
    """Placeholder (DeepSpeed): creating one fails."""


class DeepSpeedSchedulerWrapper(_PendingClass):
    """Placeholder (DeepSpeed): creating one fails."""


def get_active_deepspeed_plugin(*args: Any, **kwargs: Any) -> NoReturn:
    """Placeholder (DeepSpeed): fails when called."""
    _missing("get_active_deepspeed_plugin", _DEEPSPEED)


def map_pytorch_optim_to_deepspeed(*args: Any, **kwargs: Any) -> NoReturn:
    """Placeholder (DeepSpeed): fails when called."""
    _missing("map_pytorch_optim_to_deepspeed", _DEEPSPEED)


DEEPSPEED_NAMES = [
    "HfDeepSpeedConfig",
    "DummyOptim",
    "DummyScheduler",
    "DeepSpeedEngineWrapper",
    "DeepSpeedOptimizerWrapper",
    "DeepSpeedSchedulerWrapper",
    "get_active_deepspeed_plugin",
    "map_pytorch_optim_to_deepspeed",
]
__all__ = DEEPSPEED_NAMES
