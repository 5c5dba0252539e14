"""The Accelerator's process-control and collective methods, over ``self.state``.

A public component of the `Accelerator` facade: the documented methods
are defined (and documented) here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from accel_state import operations
from accel_state.nested import recursively_apply

__all__ = ["ProcessOperations"]


class ProcessOperations:
    """Collectives, process control and printing; every collective is a no-op in one process."""

    state: Any
    gradient_state: Any
    flag_tensor: torch.Tensor | None

    # -- collectives --------------------------------------------------------------------------------

    def gather(self, tensor: Any) -> Any:
        """Gather (nested) tensors from every process, concatenated on the first dimension.

        Args:
            tensor: a tensor, or a nested list/tuple/dict of tensors, to gather from all processes.

        Returns:
            The gathered data, with the same structure as ``tensor``.
        """
        return operations.gather(tensor)

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        """Gather for metric computation, dropping the samples duplicated to even out the last batch.

        On the last batch of a loader whose length is known, only the first ``remainder`` entries (the
        real samples of that global batch) are kept; -1 (unknown length) or 0 (no partial batch) keeps all,
        and so does data holding a value that cannot be cut (a 0-dim tensor), as in the documented system.

        Args:
            input_data: the (nested) tensors, or any picklable objects, computed on this process.
            use_gather_object: gather with ``gather_object`` (any picklable object) instead of tensor
                collectives (default `False`); forced on when ``input_data`` holds non-tensors.

        Returns:
            The gathered data, without the duplicated samples of the last batch.
        """
        try:
            recursively_apply(lambda x: x, input_data, error_on_other_type=True)
            all_tensors = True
        except TypeError:
            all_tensors = False
        use_gather_object = use_gather_object or not all_tensors
        data = operations.gather_object(input_data) if use_gather_object else operations.gather(input_data)
        gradient_state = self.gradient_state
        if not gradient_state.end_of_dataloader:
            return data
        real = gradient_state.remainder  # real samples in the last global batch (-1: unknown, 0: it was full)
        if real <= 0:
            return data
        if use_gather_object:
            return data[:real]
        try:
            return recursively_apply(lambda tensor: tensor[:real], data)
        except IndexError:  # a 0-dim value (one process: nothing was gathered) cannot be cut: as it is
            return data

    def reduce(self, tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        """Reduce (nested) tensors across processes with ``sum``, ``mean`` or ``none``.

        Args:
            tensor: a tensor, or a nested list/tuple/dict of tensors, to reduce.
            reduction: the reduction: ``"sum"``, ``"mean"`` or ``"none"`` (default `"sum"`).
            scale: a factor applied to the result after the reduction (default `1.0`).

        Returns:
            The reduced data, with the same structure as ``tensor``.
        """
        return operations.reduce(tensor, reduction, scale)

    def pad_across_processes(self, tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False) -> Any:
        """Pad (nested) tensors on ``dim`` to the largest size found on any process.

        Args:
            tensor: a tensor, or a nested list/tuple/dict of tensors, to pad.
            dim: the dimension to pad (default `0`).
            pad_index: the value used for padding (default `0`).
            pad_first: pad at the beginning of ``dim`` instead of the end (default `False`).

        Returns:
            The padded data, with the same structure as ``tensor``.
        """
        return operations.pad_across_processes(tensor, dim=dim, pad_index=pad_index, pad_first=pad_first)

    # -- process control ----------------------------------------------------------------------------

    def wait_for_everyone(self) -> None:
        """Barrier across every process (nothing in one process)."""
        self.state.wait_for_everyone()

    @contextlib.contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Iterator[Any]:
        """Yield this process's share of ``inputs`` (list, tuple, tensor or dict of them).

        Args:
            inputs: the data to split; dictionaries are split value by value.
            apply_padding: repeat the last element so that every process gets the same number of
                elements (default `False`).

        Yields:
            The part of ``inputs`` assigned to this process.
        """
        with self.state._partial.split_between_processes(inputs, apply_padding=apply_padding) as share:
            yield share

    @contextlib.contextmanager
    def main_process_first(self) -> Iterator[None]:
        """Run the block on the main process first, then on the others."""
        with self.state._partial.main_process_first():
            yield

    @contextlib.contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        """Run the block on each machine's local main process first, then on the others."""
        with self.state._partial.local_main_process_first():
            yield

    def on_main_process(self, function: Callable[..., Any] | None = None) -> Any:
        """Decorator: run only on the main process.

        Args:
            function: the function to decorate.

        Returns:
            The wrapped function, which does nothing on other processes.

        Raises:
            ValueError: if ``function`` is not given.
        """
        if function is None:
            raise ValueError("on_main_process is a decorator: use `@accelerator.on_main_process` on a function")
        return self.state._partial.on_main_process(function)

    def on_local_main_process(self, function: Callable[..., Any] | None = None) -> Any:
        """Decorator: run only on each machine's local main process.

        Args:
            function: the function to decorate.

        Returns:
            The wrapped function, which does nothing on other processes.

        Raises:
            ValueError: if ``function`` is not given.
        """
        if function is None:
            raise ValueError("on_local_main_process is a decorator: use it on a function")
        return self.state._partial.on_local_main_process(function)

    def on_last_process(self, function: Callable[..., Any]) -> Any:
        """Decorator: run only on the last process.

        Args:
            function: the function to decorate.

        Returns:
            The wrapped function, which does nothing on other processes.
        """
        return self.state._partial.on_last_process(function)

    def on_process(self, function: Callable[..., Any] | None = None, process_index: int | None = None) -> Any:
        """Decorator: run only on the process of global index ``process_index``.

        Args:
            function: the function to decorate.
            process_index: the global index of the process that runs ``function``.

        Returns:
            The wrapped function, which does nothing on other processes.

        Raises:
            ValueError: if ``process_index`` is not given.
        """
        if process_index is None:
            raise ValueError("on_process needs `process_index`: `@accelerator.on_process(process_index=1)`")
        return self.state._partial.on_process(function, process_index=process_index)

    def on_local_process(
        self, function: Callable[..., Any] | None = None, local_process_index: int | None = None
    ) -> Any:
        """Decorator: run only on the process of local index ``local_process_index``.

        Args:
            function: the function to decorate.
            local_process_index: the index, on its machine, of the process that runs ``function``.

        Returns:
            The wrapped function, which does nothing on other processes.

        Raises:
            ValueError: if ``local_process_index`` is not given.
        """
        if local_process_index is None:
            raise ValueError("on_local_process needs `local_process_index`")
        return self.state._partial.on_local_process(function, local_process_index=local_process_index)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` once per machine.

        Args:
            *args: positional arguments passed on to ``print``.
            **kwargs: keyword arguments passed on to ``print``.
        """
        self.state._partial.print(*args, **kwargs)

    # -- cross-process trigger ----------------------------------------------------------------------

    def set_trigger(self) -> None:
        """Raise the trigger on this process; `check_trigger()` sees it on every process."""
        self.flag_tensor = torch.tensor(1, device=self.state.device)

    def check_trigger(self) -> bool:
        """True on every process when any process called `set_trigger()` (then resets it)."""
        if self.flag_tensor is None:
            self.flag_tensor = torch.tensor(0, device=self.state.device)
        flags = operations.reduce(self.flag_tensor, "sum")
        if int(flags.item()) >= 1:
            self.flag_tensor = torch.tensor(0, device=self.state.device)
            return True
        return False
