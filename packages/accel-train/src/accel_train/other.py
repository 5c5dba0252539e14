"""Small documented utilities of ``accel.utils`` (the module behind ``accel.utils.other``).

Unwrapping and compiling models, saving and loading objects once per machine, and the helpers that
libraries built on the documented system call (``extract_model_from_parallel``, ``is_compiled_module``,
``clean_state_dict_for_safetensors``, ``merge_dicts``, ...). Optional libraries (deepspeed, peft,
torch_xla) are only looked at inside the functions that need them.
"""

from __future__ import annotations

import enum
import functools
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

import torch

from accel_bigmodel.estimate import convert_bytes
from accel_state.environment import check_os_kernel
from accel_state.logging import get_logger
from accel_state.operations import CannotPadNestedTensorWarning
from accel_train import wrappers
from accel_train.checkpoint.file_io import load, save

logger = get_logger(__name__)

__all__ = [
    "CannotPadNestedTensorWarning",
    "CustomDtype",
    "check_os_kernel",
    "clean_state_dict_for_safetensors",
    "compile_regions",
    "compile_regions_deepspeed",
    "compile_regions_fsdp2",
    "convert_bytes",
    "extract_model_from_parallel",
    "get_grad_scaler",
    "get_mixed_precision_context_manager",
    "get_module_class_from_name",
    "get_pretty_name",
    "has_compiled_regions",
    "install_xla",
    "is_compiled_module",
    "is_peft_model",
    "load",
    "merge_dicts",
    "model_has_dtensor",
    "recursive_getattr",
    "save",
]


class CustomDtype(enum.Enum):
    """Data types torch has no dtype for (sizes of quantized and FP8 weights)."""

    FP8 = "fp8"
    INT4 = "int4"
    INT2 = "int2"


# -- compiled modules and unwrapping: the same functions as accel_train.wrappers ----------------------

is_compiled_module = wrappers.is_compiled
has_compiled_regions = wrappers.has_compiled_regions
compile_regions = wrappers.compile_regions
compile_regions_deepspeed = wrappers.compile_regions_in_place
compile_regions_fsdp2 = wrappers.compile_regions_in_place
extract_model_from_parallel = wrappers.unwrap_model


def model_has_dtensor(model: torch.nn.Module) -> bool:
    """True when a parameter of ``model`` is a ``DTensor`` (tensor parallel or FSDP2).

    Args:
        model: The model to inspect.
    """
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        return False
    return any(isinstance(p, DTensor) for p in model.parameters())


def is_peft_model(model: Any) -> bool:
    """True when ``model`` (unwrapped) is a peft ``PeftModel``.

    Args:
        model: The model to inspect; wrappers are removed first.
    """
    from accel_state.imports import is_peft_available

    if not is_peft_available():
        return False
    try:
        from peft import PeftModel
    except ImportError:  # peft installed but unusable here (it needs accelerate: see ACCEL_PROVIDE_ACCELERATE)
        return False

    return isinstance(extract_model_from_parallel(model), PeftModel)


def get_module_class_from_name(module: torch.nn.Module, name: str) -> type | None:
    """The class of the first sub-module of ``module`` (itself included) whose class is called ``name``.

    Args:
        module: The module searched, itself and its sub-modules.
        name: The class name looked for.
    """
    for child in module.modules():
        if type(child).__name__ == name:
            return type(child)
    return None


# -- mixed precision --------------------------------------------------------------------------------


def _device_type() -> str:
    from accel_state.state import PartialState

    return PartialState().device.type


def get_grad_scaler(distributed_type: Any = None, **kwargs: Any) -> Any:
    """A gradient scaler for fp16 on this process's device (FSDP's sharded scaler under FSDP).

    Args:
        distributed_type: The run's distributed type; `FSDP` gives the sharded scaler. Defaults to `None`.
        **kwargs: Keyword arguments of the scaler (``init_scale``, ``growth_factor`` ...).
    """
    if str(getattr(distributed_type, "value", distributed_type)) == "FSDP":
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(**kwargs)
    return torch.amp.GradScaler(_device_type(), **kwargs)


def get_mixed_precision_context_manager(native_amp: bool = False, autocast_kwargs: Any = None) -> Any:
    """The autocast context of the mixed precision in use (``AcceleratorState().mixed_precision``), or a
    null context when ``native_amp`` is False or there is none.

    Args:
        native_amp: Whether native mixed precision is in use; `False` gives a null context. Defaults to `False`.
        autocast_kwargs: An ``AutocastKwargs`` or a dict of extra ``torch.autocast`` arguments. Defaults to `None`.
    """
    import contextlib

    from accel_state.state import AcceleratorState

    if not native_amp:
        return contextlib.nullcontext()
    precision = str(AcceleratorState().mixed_precision)
    kwargs = autocast_kwargs.to_kwargs() if hasattr(autocast_kwargs, "to_kwargs") else dict(autocast_kwargs or {})
    if precision == "fp16":
        return torch.autocast(device_type=_device_type(), dtype=torch.float16, **kwargs)
    if precision in ("bf16", "fp8"):
        return torch.autocast(device_type=_device_type(), dtype=torch.bfloat16, **kwargs)
    return contextlib.nullcontext()


# -- saving and loading -----------------------------------------------------------------------------


def clean_state_dict_for_safetensors(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state_dict`` ready for safetensors: names sharing storage kept once (the first), tensors contiguous.

    Args:
        state_dict: The state dict to clean.
    """
    seen: dict[tuple[Any, ...], str] = {}
    cleaned: dict[str, torch.Tensor] = {}
    dropped: list[str] = []
    for name, tensor in state_dict.items():
        if isinstance(tensor, torch.Tensor) and tensor.device.type != "meta":
            key = (
                tensor.device,
                tensor.untyped_storage().data_ptr(),
                tensor.storage_offset(),
                tensor.shape,
                tensor.stride(),
            )
            if key in seen:
                dropped.append(name)
                continue
            seen[key] = name
        cleaned[name] = tensor.contiguous() if isinstance(tensor, torch.Tensor) else tensor
    if dropped:
        logger.warning(f"Removed shared tensor(s) {dropped} while saving; they are tied to other weights.")
    return cleaned


# -- small helpers ----------------------------------------------------------------------------------


def get_pretty_name(obj: Any) -> str:
    """A readable name for a function, class or instance (its qualified name, else its class's).

    Args:
        obj: The function, class or instance to name.
    """
    if not hasattr(obj, "__qualname__") and not hasattr(obj, "__name__"):
        obj = getattr(obj, "__class__", obj)
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    return str(name) if name is not None else str(obj)


def merge_dicts(source: Mapping[str, Any], destination: dict[str, Any]) -> dict[str, Any]:
    """Merge ``source`` into ``destination`` recursively (nested dicts merged, other values replaced).

    Args:
        source: The values to merge in.
        destination: The dict updated in place and returned.
    """
    for key, value in source.items():
        if isinstance(value, Mapping):
            node = destination.setdefault(key, {})
            merge_dicts(value, node)
        else:
            destination[key] = value
    return destination


def recursive_getattr(obj: Any, attr: str) -> Any:
    """``getattr`` along a dotted path: ``recursive_getattr(model, "encoder.layer.0")``.

    Args:
        obj: The object the path starts from.
        attr: Dotted attribute path.
    """
    return functools.reduce(getattr, attr.split("."), obj)


def install_xla(upgrade: bool = False) -> None:
    """Install torch_xla for the running torch (Google Colab only, as documented).

    Args:
        upgrade: Whether pip is run with ``--upgrade``. Defaults to `False`.

    Raises:
        RuntimeError: Not running in Google Colab.
    """
    if "google.colab" not in sys.modules:
        raise RuntimeError("`install_xla` utility works only on google colab.")
    command = [sys.executable, "-m", "pip", "install"] + (["--upgrade"] if upgrade else [])
    command.append(f"torch_xla[tpu]=={torch.__version__.split('+')[0]}")
    subprocess.run(command, check=True)
