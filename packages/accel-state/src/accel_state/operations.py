"""Collective operations on tensors and nested structures of tensors.

Each is a no-op (or the obvious identity) in a single process, and a clear error when the launcher
says there are several processes but ``torch.distributed`` was never initialised. In debug mode
(``ACCELERATE_DEBUG_MODE=1``) the processes first compare the shapes they are about to send and
all raise `DistributedOperationException`, naming every rank's shapes, instead of hanging.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from accel_state import cluster
from accel_state.hangs import watched_collective
from accel_state.kept_works import all_gather_object, wait_and_keep
from accel_state.kept_works import broadcast_object_list as _broadcast_objects
from accel_state.nested import (  # noqa: F401  (re-exported: the documented home of these names)
    ConvertOutputsToFp32,
    DistributedOperationException,
    TensorInformation,
    concatenate,
    convert_outputs_to_fp32,
    convert_to_fp32,
    find_batch_size,
    find_device,
    get_data_structure,
    get_shape,
    honor_type,
    ignorant_find_batch_size,
    initialize_tensors,
    is_namedtuple,
    is_tensor_information,
    is_torch_tensor,
    listify,
    recursively_apply,
    send_to_device,
    slice_tensors,
)
from accel_state.xla_ops import on_xla, xla_broadcast, xla_gather, xla_reduce

F = TypeVar("F", bound=Callable[..., Any])


#: The variables through which a launcher or scheduler says there are several processes (cluster.detect).
_WORLD_KEYS = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE", "SLURM_NTASKS")


def world_size(operation: str = "this operation") -> int:
    """Number of processes; an error if the launcher says several but no process group exists."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    environ = os.environ
    if not any(key in environ for key in _WORLD_KEYS):
        return 1  # started without a launcher: one process (no parsing on every collective)
    expected = cluster.detect(environ).world_size
    if expected > 1:
        raise RuntimeError(
            f"{operation} needs torch.distributed, but it is not initialized although the launcher started "
            f"{expected} processes. Create `PartialState()` or `Accelerator()` before calling it."
        )
    return 1


class CannotPadNestedTensorWarning(UserWarning):
    """``pad_across_processes`` met a nested tensor: it cannot know how to pad it and leaves it as is."""


def _debug_mode() -> bool:
    """Debug checks on: ``PartialState().debug`` once the state exists (it may be changed at run time),
    else ``ACCELERATE_DEBUG_MODE``."""
    from accel_state.state import PartialState

    shared = PartialState._shared_state
    if shared.get("_initialized") and "debug" in shared:
        return bool(shared["debug"])
    return os.environ.get("ACCELERATE_DEBUG_MODE", "").lower() in ("1", "true", "yes", "on", "y", "t")


def _shapes(data: Any) -> Any:
    return recursively_apply(lambda t: list(t.shape), data)


def _dtypes(data: Any) -> Any:
    return recursively_apply(lambda t: str(t.dtype).replace("torch.", ""), data)


def verify_operation(function: F) -> F:
    """In debug mode, check that every process sends tensors of the same shapes before ``function`` runs.

    Args:
        function: The collective to wrap.
    """

    @wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        name = function.__name__
        if not _debug_mode() or world_size(name) == 1:
            return function(*args, **kwargs)
        tensor = kwargs["tensor"] if "tensor" in kwargs else args[0]
        mine = (f"{function.__module__}.{name}", _shapes(tensor), _dtypes(tensor))
        everyone: list[Any] = [None] * dist.get_world_size()
        all_gather_object(everyone, mine)
        if any(entry != everyone[0] for entry in everyone):
            operations = {entry[0] for entry in everyone}
            show_dtypes = any(entry[2] != everyone[0][2] for entry in everyone)
            lines = [
                f"  - Process {rank}: {shapes}"
                + (f" ({dtypes})" if show_dtypes else "")
                + (f" in `{op}`" if len(operations) > 1 else "")
                for rank, (op, shapes, dtypes) in enumerate(everyone)
            ]
            raise DistributedOperationException(
                "Cannot apply desired operation due to shape mismatches. All shapes across devices must be valid."
                f"\n\nOperation: `{mine[0]}`\nInput shapes:\n" + "\n".join(lines)
            )
        return function(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def chained_operation(function: F) -> F:
    """Re-raise a `DistributedOperationException` from an inner collective with the outer name.

    Args:
        function: The collective to wrap.
    """

    @wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except DistributedOperationException as error:
            raise DistributedOperationException(
                f"Error found while calling `{function.__name__}`. Please see the earlier error for more details."
            ) from error

    return wrapper  # type: ignore[return-value]


def _gather_one(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.ndim == 0:
        tensor = tensor.clone()[None]
    tensor = tensor.contiguous()
    size = dist.get_world_size()
    if dist.get_backend() != "gloo":
        out = torch.empty((size * tensor.shape[0], *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
        wait_and_keep(dist.all_gather_into_tensor(out, tensor, async_op=True))
        return out
    parts = [torch.empty_like(tensor) for _ in range(size)]
    wait_and_keep(dist.all_gather(parts, tensor, async_op=True))
    return torch.cat(parts, dim=0)


@watched_collective()
@verify_operation
def gather(tensor: Any) -> Any:
    """Concatenate ``tensor`` (or each tensor in a nested structure) from every process along dim 0.

    Args:
        tensor: A tensor, or a nested structure of tensors, with the same shapes on every process.
    """
    if on_xla():
        return recursively_apply(xla_gather, tensor, error_on_other_type=True)
    if world_size("gather") == 1:
        return tensor
    return recursively_apply(_gather_one, tensor, error_on_other_type=True)


@watched_collective()
def gather_object(object: Any) -> list[Any]:
    """Gather picklable objects from every process; lists are concatenated, other objects listed.

    Args:
        object: A picklable object, or a list of them (lists are concatenated).
    """
    if world_size("gather_object") == 1:
        return object
    everyone: list[Any] = [None] * dist.get_world_size()
    all_gather_object(everyone, object)
    if all(isinstance(item, (list, tuple)) for item in everyone):
        return [x for item in everyone for x in item]
    return everyone


def _broadcast_one(tensor: torch.Tensor, src: int) -> torch.Tensor:
    tensor = tensor.contiguous()
    wait_and_keep(dist.broadcast(tensor, src=src, async_op=True))
    return tensor


@watched_collective()
@verify_operation
def broadcast(tensor: Any, from_process: int = 0) -> Any:
    """Send ``tensor`` (or a nested structure of tensors) from ``from_process`` to every process.

    Args:
        tensor: The tensor (or nested structure of tensors) to send or receive into; same shapes on every
            process.
        from_process: Index of the process whose value is sent to the others.
    """
    if on_xla():
        return recursively_apply(xla_broadcast, tensor, error_on_other_type=True, from_process=from_process)
    if world_size("broadcast") == 1:
        return tensor
    return recursively_apply(_broadcast_one, tensor, error_on_other_type=True, src=from_process)


@watched_collective()
def broadcast_object_list(object_list: list[Any], from_process: int = 0) -> list[Any]:
    """Replace, in place, the items of ``object_list`` by those of process ``from_process``.

    Args:
        object_list: A list of picklable objects; on the other processes it is overwritten in place.
        from_process: Index of the process whose value is sent to the others.
    """
    if world_size("broadcast_object_list") == 1:
        return object_list
    _broadcast_objects(object_list, src=from_process)
    return object_list


_REDUCE_OPS = {"sum": "SUM", "mean": "SUM", "max": "MAX", "min": "MIN"}


@watched_collective()
@verify_operation
def reduce(tensor: Any, reduction: str = "mean", scale: float = 1.0) -> Any:
    """Reduce tensors across processes, element-wise, then multiply by ``scale``.

    ``reduction`` is ``sum``, ``mean``, ``max``, ``min`` or ``none`` (each process keeps its own).

    Args:
        tensor: A tensor or nested structure of tensors.
        reduction: `sum`, `mean` or `none`.
        scale: A factor the result is multiplied by.
    """
    if reduction not in (*_REDUCE_OPS, "none"):
        raise ValueError(f"reduction must be 'sum', 'mean', 'max', 'min' or 'none', got {reduction!r}")
    if on_xla():
        from accel_state.state import PartialState

        replicas = PartialState().num_processes
        return recursively_apply(
            xla_reduce, tensor, error_on_other_type=True, reduction=reduction, scale=scale, world_size=replicas
        )
    size = world_size("reduce")

    def _reduce_one(t: torch.Tensor) -> torch.Tensor:
        out = t.clone()
        if size > 1 and reduction != "none":
            wait_and_keep(dist.all_reduce(out, op=getattr(dist.ReduceOp, _REDUCE_OPS[reduction]), async_op=True))
        if reduction == "mean":
            out = out / size
        return out * scale if scale != 1.0 else out

    return recursively_apply(_reduce_one, tensor, error_on_other_type=True)


@watched_collective()
@chained_operation
def pad_across_processes(tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False) -> Any:
    """Pad tensors along ``dim`` with ``pad_index`` to the largest size among processes, so they can be gathered.

    Args:
        tensor: A tensor or nested structure of tensors, whose sizes may differ between processes along `dim`.
        dim: The dimension to pad.
        pad_index: The value padding is filled with.
        pad_first: Pad at the start instead of the end.
    """
    size = world_size("pad_across_processes")

    def _pad_one(t: torch.Tensor) -> torch.Tensor:
        if getattr(t, "is_nested", False):
            warnings.warn(
                "pad_across_processes cannot pad a nested tensor (its components may differ in size); "
                "it is returned unpadded",
                CannotPadNestedTensorWarning,
                stacklevel=4,
            )
            return t
        if dim >= t.ndim or dim < -t.ndim or size == 1:
            return t
        shape = torch.tensor(t.shape, device=t.device)[None]
        # Through the checked `gather`: in debug mode tensors of different rank on different
        # processes raise DistributedOperationException on every rank instead of aborting gloo.
        sizes = gather(shape).cpu()
        longest = int(sizes[:, dim].max())
        if longest == t.shape[dim]:
            return t
        new_shape = list(t.shape)
        new_shape[dim] = longest
        out = t.new_full(new_shape, pad_index)
        index = [slice(None)] * t.ndim
        index[dim] = slice(longest - t.shape[dim], longest) if pad_first else slice(0, t.shape[dim])
        out[tuple(index)] = t
        return out

    return recursively_apply(_pad_one, tensor, error_on_other_type=True)


def pad_input_tensors(tensor: Any, batch_size: int, num_processes: int, dim: int = 0) -> Any:
    """Pad tensors along ``dim`` (repeating zeros) so ``batch_size`` divides evenly by ``num_processes``.

    Args:
        tensor: A tensor or nested structure of tensors.
        batch_size: The current size along `dim`.
        num_processes: The number of processes it must divide into.
        dim: The dimension to pad.
    """
    remainder = batch_size % num_processes
    if remainder == 0:
        return tensor
    missing = num_processes - remainder

    def _pad_one(t: torch.Tensor) -> torch.Tensor:
        if dim >= t.ndim:
            return t
        shape = list(t.shape)
        shape[dim] = missing
        return torch.cat([t, t.new_zeros(shape)], dim=dim)

    return recursively_apply(_pad_one, tensor, error_on_other_type=True)


def copy_tensor_to_devices(tensor: torch.Tensor | None = None) -> torch.Tensor:
    """Send a tensor that exists on process 0 only to every process (others pass ``None``).

    Args:
        tensor: The tensor on process 0; `None` on the others.
    """
    if world_size("copy_tensor_to_devices") == 1:
        if tensor is None:
            raise ValueError("copy_tensor_to_devices needs a tensor on the main process")
        return tensor
    rank = dist.get_rank()
    meta: list[Any] = [
        (tuple(tensor.shape), tensor.dtype, str(tensor.device)) if rank == 0 and tensor is not None else None
    ]
    _broadcast_objects(meta, src=0)
    if meta[0] is None:
        raise ValueError("copy_tensor_to_devices needs a tensor on process 0")
    shape, dtype, device = meta[0]
    if rank != 0:
        from accel_state.state import PartialState, is_initialized

        target = PartialState().device if is_initialized() else torch.device(device)
        tensor = torch.empty(shape, dtype=dtype, device=target)
    assert tensor is not None
    wait_and_keep(dist.broadcast(tensor, src=0, async_op=True))
    return tensor


def gather_tensor_shape(tensor: torch.Tensor) -> list[int]:
    """Shape of the tensor held by process 0, known on every process.

    Args:
        tensor: The tensor whose shape every process learns.
    """
    meta: list[Any] = [list(tensor.shape) if tensor is not None else None]
    if world_size("gather_tensor_shape") > 1:
        _broadcast_objects(meta, src=0)
    return meta[0]
