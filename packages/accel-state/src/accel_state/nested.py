"""Operations on tensors inside nested lists, tuples, namedtuples and dicts (no communication)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import update_wrapper
from typing import Any

import torch


class DistributedOperationException(Exception):
    """A collective was called with inputs that differ across processes (found in debug mode)."""


def is_torch_tensor(tensor: Any) -> bool:
    """True when ``tensor`` is a ``torch.Tensor``.

    Args:
        tensor: A tensor, or a nested list / tuple / dict of tensors.
    """
    return isinstance(tensor, torch.Tensor)


def is_tensor_information(tensor_info: Any) -> bool:
    """True when ``tensor_info`` is a ``TensorInformation`` (shape and dtype of a tensor to come).

    Args:
        tensor_info: The object to test.
    """
    return isinstance(tensor_info, TensorInformation)


def is_namedtuple(data: Any) -> bool:
    """True for instances of ``collections.namedtuple`` / ``typing.NamedTuple`` classes.

    Args:
        data: A tensor, or a nested list / tuple / dict of tensors (other leaves are kept as they are).
    """
    return isinstance(data, tuple) and hasattr(data, "_fields") and hasattr(data, "_asdict")


class TensorInformation:
    """Shape and dtype of a tensor, standing for it when only its description travels.

    Args:
        shape: Shape of the tensor.
        dtype: Its dtype.
    """

    def __init__(self, shape: torch.Size, dtype: torch.dtype) -> None:
        self.shape = shape
        self.dtype = dtype

    def __repr__(self) -> str:
        return f"TensorInformation(shape={tuple(self.shape)}, dtype={self.dtype})"


def honor_type(obj: Any, generator: Any) -> Any:
    """Rebuild a list, tuple or namedtuple of ``obj``'s type from ``generator``.

    Args:
        generator: The generator to synchronise; `None` uses the one of the RNG type.
        obj: The sequence whose type (list, tuple or namedtuple) is kept.
    """
    if is_namedtuple(obj):
        return type(obj)(*list(generator))
    return type(obj)(generator)


def _rebuild_mapping(data: Mapping, items: dict[Any, Any]) -> Any:
    try:
        return type(data)(items)  # type: ignore[call-arg]
    except Exception:
        try:
            clone: Any = type(data).__new__(type(data))  # type: ignore[call-overload]
            clone.update(items)
            return clone
        except Exception:
            return items


def recursively_apply(
    func: Callable[..., Any],
    data: Any,
    *args: Any,
    test_type: Callable[[Any], bool] = is_torch_tensor,
    error_on_other_type: bool = False,
    **kwargs: Any,
) -> Any:
    """Apply ``func`` to every leaf of ``data`` that passes ``test_type``, keeping the container types.

    Args:
        data: A tensor, or a nested list / tuple / dict of tensors (other leaves are kept as they are).
        *args: Positional arguments passed on unchanged.
        **kwargs: Keyword arguments passed on unchanged.
        func: The function applied to each leaf that passes `test_type`.
        test_type: Which leaves `func` applies to (default: tensors).
        error_on_other_type: Raise `TypeError` on a leaf of another type instead of returning it unchanged.
    """
    if isinstance(data, (tuple, list)):
        return honor_type(
            data,
            (
                recursively_apply(
                    func, item, *args, test_type=test_type, error_on_other_type=error_on_other_type, **kwargs
                )
                for item in data
            ),
        )
    if isinstance(data, Mapping):
        return _rebuild_mapping(
            data,
            {
                key: recursively_apply(
                    func, value, *args, test_type=test_type, error_on_other_type=error_on_other_type, **kwargs
                )
                for key, value in data.items()
            },
        )
    if test_type(data):
        return func(data, *args, **kwargs)
    if error_on_other_type:
        raise TypeError(
            f"Unsupported types ({type(data)}) passed to `{getattr(func, '__name__', func)}`. Only nested "
            f"list/tuple/dicts of objects that are valid for `{test_type.__name__}` should be passed."
        )
    return data


def send_to_device(
    tensor: Any, device: Any, non_blocking: bool = False, skip_keys: str | Sequence[str] | None = None
) -> Any:
    """Move every tensor (or object with ``.to``) in ``tensor`` to ``device``; ``skip_keys`` stay put.

    Args:
        tensor: A tensor, or a nested list / tuple / dict of tensors.
        device: The target device.
        non_blocking: Copy asynchronously where the device allows it.
        skip_keys: Keys of dicts whose values are left where they are (a string or a list of them).
    """
    if isinstance(tensor, (tuple, list)):
        return honor_type(tensor, (send_to_device(t, device, non_blocking, skip_keys) for t in tensor))
    if isinstance(tensor, Mapping):
        skip = {skip_keys} if isinstance(skip_keys, str) else set(skip_keys or ())
        return _rebuild_mapping(
            tensor,
            {k: v if k in skip else send_to_device(v, device, non_blocking, skip_keys) for k, v in tensor.items()},
        )
    if isinstance(tensor, torch.Tensor):
        target = torch.device(device) if not isinstance(device, torch.device) else device
        if tensor.device == target or (target.index is None and tensor.device.type == target.type):
            return tensor
        if target.type == "mps" or tensor.device.type == "mps":
            return tensor.to(target)
        return tensor.to(target, non_blocking=non_blocking)
    mover = getattr(tensor, "to", None)
    if callable(mover) and not isinstance(tensor, type):
        try:
            return mover(device, non_blocking=non_blocking)
        except TypeError:
            return mover(device)
    return tensor


def get_data_structure(data: Any) -> Any:
    """``data`` with each tensor replaced by its `TensorInformation`.

    Args:
        data: A tensor, or a nested list / tuple / dict of tensors (other leaves are kept as they are).
    """
    return recursively_apply(lambda t: TensorInformation(shape=t.shape, dtype=t.dtype), data)


def get_shape(data: Any) -> Any:
    """``data`` with each tensor replaced by its shape as a list.

    Args:
        data: A tensor, or a nested list / tuple / dict of tensors (other leaves are kept as they are).
    """
    return recursively_apply(lambda t: list(t.shape), data)


def initialize_tensors(data_structure: Any) -> Any:
    """Empty tensors matching a structure of `TensorInformation`.

    Args:
        data_structure: A nested structure of `TensorInformation`.
    """
    return recursively_apply(
        lambda info: torch.empty(*info.shape, dtype=info.dtype), data_structure, test_type=is_tensor_information
    )


def listify(data: Any) -> Any:
    """``data`` with each tensor turned into a Python number or (nested) list.

    Args:
        data: A tensor, or a nested list / tuple / dict of tensors (other leaves are kept as they are).
    """

    def _to_list(tensor: torch.Tensor) -> Any:
        tensor = tensor.detach().cpu()
        if tensor.dtype == torch.bfloat16:
            tensor = tensor.to(torch.float32)
        return tensor.tolist()

    return recursively_apply(_to_list, data)


def find_batch_size(data: Any) -> int:
    """Size of the first dimension of the first tensor found in ``data``.

    Args:
        data: A tensor, or a nested list / tuple / dict of tensors (other leaves are kept as they are).
    """
    if isinstance(data, (tuple, list, Mapping)) and len(data) == 0:
        raise ValueError(f"cannot find the batch size from an empty {type(data).__name__}")
    if isinstance(data, (tuple, list)):
        return find_batch_size(data[0])
    if isinstance(data, Mapping):
        for value in data.values():
            return find_batch_size(value)
    if not isinstance(data, torch.Tensor):
        raise TypeError(f"can only find the batch size of tensors, got {type(data).__name__}")
    if data.dim() == 0:
        raise ValueError("cannot find the batch size of a 0-dimensional tensor")
    return int(data.shape[0])


def ignorant_find_batch_size(data: Any) -> int | None:
    """Like `find_batch_size()`, but ``None`` instead of an error.

    Args:
        data: A tensor, or a nested list / tuple / dict of tensors (other leaves are kept as they are).
    """
    try:
        return find_batch_size(data)
    except (ValueError, TypeError):
        return None


def find_device(data: Any) -> torch.device | None:
    """Device of the first tensor found in ``data`` (``None`` if there is none).

    Args:
        data: A tensor, or a nested list / tuple / dict of tensors (other leaves are kept as they are).
    """
    if isinstance(data, Mapping):
        for value in data.values():
            device = find_device(value)
            if device is not None:
                return device
    elif isinstance(data, (tuple, list)):
        for value in data:
            device = find_device(value)
            if device is not None:
                return device
    elif isinstance(data, torch.Tensor):
        return data.device
    return None


def slice_tensors(
    data: Any, tensor_slice: Any, process_index: int | None = None, num_processes: int | None = None
) -> Any:
    """``data`` with each tensor indexed by ``tensor_slice``.

    Args:
        data: A tensor, or a nested list / tuple / dict of tensors (other leaves are kept as they are).
        process_index: Global index of the process that runs the function.
        tensor_slice: The slice taken of each tensor.
        num_processes: Unused; kept for the documented signature.
    """
    return recursively_apply(lambda t: t[tensor_slice], data)


def concatenate(data: list[Any], dim: int = 0) -> Any:
    """Concatenate a list of structures of tensors along ``dim``, leaf by leaf.

    A list holding one object that is not a tensor (nor a structure of them) gives that object back.

    Args:
        data: A tensor, or a nested list / tuple / dict of tensors (other leaves are kept as they are).
        dim: The dimension to work along.
    """
    if not isinstance(data, (list, tuple)) or len(data) == 0:
        raise ValueError("concatenate needs a non-empty list of tensors or of structures of tensors")
    first = data[0]
    if isinstance(first, (tuple, list)):
        return honor_type(first, (concatenate([d[i] for d in data], dim=dim) for i in range(len(first))))
    if isinstance(first, Mapping):
        return _rebuild_mapping(first, {key: concatenate([d[key] for d in data], dim=dim) for key in first})
    if not isinstance(first, torch.Tensor):
        if len(data) == 1:
            return first  # a single batch of anything is returned as it is
        raise TypeError(f"can only concatenate tensors, got {type(first).__name__}")
    return torch.cat(list(data), dim=dim)


def convert_to_fp32(tensor: Any) -> Any:
    """``tensor`` with every fp16 / bf16 tensor converted to fp32.

    Args:
        tensor: A tensor, or a nested list / tuple / dict of tensors.
    """
    return recursively_apply(
        lambda t: t.float(),
        tensor,
        test_type=lambda t: isinstance(t, torch.Tensor) and t.dtype in (torch.float16, torch.bfloat16),
    )


class ConvertOutputsToFp32:
    """Wrap a forward so its half-precision outputs come back in fp32 (picklable).

    Args:
        model_forward: The `forward` function whose outputs are converted.
    """

    def __init__(self, model_forward: Callable[..., Any]) -> None:
        self.model_forward = model_forward
        update_wrapper(self, model_forward)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return convert_to_fp32(self.model_forward(*args, **kwargs))

    def __getstate__(self) -> Any:
        raise RuntimeError(
            "Cannot pickle a prepared model with automatic mixed precision, please unwrap the model with "
            "`Accelerator.unwrap_model(model)` before pickling it."
        )


def convert_outputs_to_fp32(model_forward: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator form of `ConvertOutputsToFp32`.

    Args:
        model_forward: The `forward` function whose outputs are converted.
    """
    model_forward = ConvertOutputsToFp32(model_forward)

    def forward(*args: Any, **kwargs: Any) -> Any:
        return model_forward(*args, **kwargs)

    forward.__wrapped__ = model_forward  # type: ignore[attr-defined]
    return forward
