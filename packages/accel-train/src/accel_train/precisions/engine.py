"""The precision of a backend whose engine does mixed precision itself (DeepSpeed, Megatron-LM).

The engine casts the model to fp16 / bf16 and scales the loss from its own config, so accel adds no
autocast and no gradient scaler; ``mode`` only reports what the engine trains in. FP8 under an engine is
`accel_train.precisions.fp8.EngineFP8Precision` (torchao's layers, the engine in bf16).
"""

from __future__ import annotations

from typing import Any, ClassVar

from accel_train.precisions.base import Precision

__all__ = ["EnginePrecision", "no_scaler"]


class EnginePrecision(Precision):
    """No autocast, no gradient scaler: the engine runs the mixed precision its config names."""

    modes: ClassVar[tuple[str, ...]] = ("no", "fp16", "bf16")

    @property
    def native_amp(self) -> bool:
        return False


def no_scaler(*args: Any, **kwargs: Any) -> None:
    """Gradient-scaler factory giving none: the engine's optimizer holds the fp16 loss scaler."""
    return None
