"""Finding a batch size that fits, and giving memory back."""

from __future__ import annotations

import functools
import gc
import inspect
from collections.abc import Callable
from typing import Any

_OOM_MESSAGES = (
    "CUDA out of memory.",
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",
    "DefaultCPUAllocator: can't allocate memory",
    "CUDA error: out of memory",
    "XPU out of memory.",
    "MPS backend out of memory",
    "out of memory",
)


def clear_device_cache(garbage_collection: bool = False) -> None:
    """Empty the cache of whichever accelerator is in use (and run the garbage collector if asked).

    Args:
        garbage_collection: Run `gc.collect()` first.
    """
    if garbage_collection:
        gc.collect()
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    for name in ("xpu", "npu", "mlu", "musa", "mps"):
        module = getattr(torch, name, None)
        if module is not None and hasattr(module, "empty_cache"):
            try:
                if name == "mps" and not torch.backends.mps.is_available():
                    continue
                if hasattr(module, "is_available") and not module.is_available():
                    continue
                module.empty_cache()
            except Exception:
                continue


def release_memory(*objects: Any) -> list[None]:
    """Drop the given references, collect garbage and empty device caches; returns ``None`` for each.

    Args:
        objects: The objects to drop; the same number of `None` is returned to assign over them.
    """
    released: list[None] = [None] * len(objects)
    del objects
    clear_device_cache(garbage_collection=True)
    return released


def should_reduce_batch_size(exception: BaseException) -> bool:
    """True when ``exception`` is an out-of-memory error that a smaller batch could avoid.

    Args:
        exception: The exception raised by the step.
    """
    import torch

    if isinstance(exception, torch.OutOfMemoryError):
        return True
    if isinstance(exception, RuntimeError) and len(exception.args) == 1:
        return any(message in str(exception.args[0]) for message in _OOM_MESSAGES)
    return False


def _takes_no_arguments(function: Callable[..., Any]) -> bool:
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return True
    return not any(
        p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        for p in signature.parameters.values()
    )


def find_executable_batch_size(
    function: Callable[..., Any] | None = None,
    starting_batch_size: int = 128,
    reduce_batch_size_fn: Callable[..., int] | None = None,
) -> Any:
    """Decorator: call ``function(batch_size, ...)``, shrinking the batch size after each out-of-memory error.

    The decorated function must take the batch size as its first argument and be called without it.
    After an out-of-memory error the batch size becomes ``int(batch_size * 0.9)``, or what
    ``reduce_batch_size_fn()`` returns (called without arguments, as the documented system does; a
    function that requires one argument is given the failed batch size). The size that last worked is
    kept: a later call of the decorated function starts from it.

    Args:
        function: The function to call; its first argument is the batch size (when used as
            `@find_executable_batch_size(...)`, leave it out).
        starting_batch_size: The batch size of the first attempt.
        reduce_batch_size_fn: Gives the next batch size from the current one; `None` halves it.

    Raises:
        RuntimeError: the batch size reached zero.
        TypeError: the batch size was passed in the call.
    """
    if function is None:
        return functools.partial(
            find_executable_batch_size,
            starting_batch_size=starting_batch_size,
            reduce_batch_size_fn=reduce_batch_size_fn,
        )
    batch_size = starting_batch_size

    def next_batch_size(failed: int) -> int:
        if reduce_batch_size_fn is None:
            return int(failed * 0.9)
        if _takes_no_arguments(reduce_batch_size_fn):
            return int(reduce_batch_size_fn())
        return int(reduce_batch_size_fn(failed))

    @functools.wraps(function)
    def decorator(*args: Any, **kwargs: Any) -> Any:
        nonlocal batch_size
        clear_device_cache(garbage_collection=True)
        params = list(inspect.signature(function).parameters)
        if len(params) < len(args) + 1:
            passed = ", ".join(f"{name}={value}" for name, value in zip(params[1:], args[1:]))
            raise TypeError(
                f"Batch size was passed into `{function.__name__}` as the first argument when called. Remove this "
                f"as the decorator already does so: `{function.__name__}({passed})`"
            )
        while True:
            if batch_size <= 0:
                raise RuntimeError("No executable batch size found, reached zero.")
            try:
                return function(batch_size, *args, **kwargs)
            except Exception as error:
                if not should_reduce_batch_size(error):
                    raise
                clear_device_cache(garbage_collection=True)
                batch_size = next_batch_size(batch_size)

    return decorator
