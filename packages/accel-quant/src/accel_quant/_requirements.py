"""Availability checks for the optional backends, with errors that name what to install.

Nothing here imports a backend at module level: each ``require_*`` imports it only when called.
"""

from __future__ import annotations

from types import ModuleType

from accel_state.imports import (
    is_4bit_bnb_available,
    is_8bit_bnb_available,
    is_bnb_available,
    is_msamp_available,
    is_torchao_available,
    is_transformer_engine_available,
)
from accel_state.install_hints import install_hint

BNB_INSTALL = install_hint("accel-quant", "bnb")
TORCHAO_INSTALL = install_hint("accel-quant", "torchao")
TE_INSTALL = install_hint("accel-quant", "transformer-engine")
MSAMP_INSTALL = "install MS-AMP from source (https://github.com/Azure/MS-AMP); it is not on PyPI"


def require_bnb(bits: int | None = None) -> ModuleType:
    """Import bitsandbytes, or raise ImportError naming the extra (and the version ``bits`` needs)."""
    if not is_bnb_available():
        raise ImportError(f"bitsandbytes quantization needs the bitsandbytes package: {BNB_INSTALL}.")
    if bits == 8 and not is_8bit_bnb_available():
        raise ImportError(f"8-bit quantization needs bitsandbytes>=0.37.2: {install_hint('bitsandbytes>=0.37.2')}.")
    if bits == 4 and not is_4bit_bnb_available():
        raise ImportError(f"4-bit quantization needs bitsandbytes>=0.39.0: {install_hint('bitsandbytes>=0.39.0')}.")
    import bitsandbytes

    return bitsandbytes


def require_torchao() -> ModuleType:
    """Import ``torchao.float8``, or raise ImportError naming the extra."""
    if not is_torchao_available():
        raise ImportError(f"The torchao FP8 backend needs the torchao package: {TORCHAO_INSTALL}.")
    import torchao.float8

    return torchao.float8


def require_transformer_engine() -> ModuleType:
    """Import ``transformer_engine.pytorch``, or raise ImportError naming the extra."""
    if not is_transformer_engine_available():
        raise ImportError(
            "The TransformerEngine FP8 backend needs the transformer-engine package (and a CUDA toolkit): "
            f"{TE_INSTALL}."
        )
    import transformer_engine.pytorch

    return transformer_engine.pytorch


def require_msamp() -> ModuleType:
    """Import ``msamp``, or raise ImportError saying how to get it."""
    if not is_msamp_available():
        raise ImportError(f"The MS-AMP FP8 backend needs the msamp package: {MSAMP_INSTALL}.")
    import msamp

    return msamp
