"""``DataLoaderDispatcher``: process 0 reads every batch, every process gets its slice of it."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import DataLoader

from accel_data import sharding
from accel_data.loaders import DataLoaderStateMixin
from accel_data.mesh import data_parallel_coordinates


def _first_non_tensor(data: Any, path: str = "batch") -> tuple[str, Any] | None:
    """Path and value of the first leaf of ``data`` that is not a tensor (None if all are tensors)."""
    if isinstance(data, torch.Tensor):
        return None
    if isinstance(data, Mapping):
        for key, value in data.items():
            found = _first_non_tensor(value, f"{path}[{key!r}]")
            if found is not None:
                return found
        return None
    if isinstance(data, (list, tuple)):
        for position, value in enumerate(data):
            found = _first_non_tensor(value, f"{path}[{position}]")
            if found is not None:
                return found
        return None
    return path, data


def _batch_size(data: Any) -> int:
    """Length of the first dimension of the first tensor anywhere in ``data``."""
    stack = [data]
    while stack:
        node = stack.pop(0)
        if isinstance(node, torch.Tensor):
            if node.dim() == 0:
                raise ValueError("DataLoaderDispatcher cannot split a batch whose tensors are 0-dimensional")
            return int(node.shape[0])
        if isinstance(node, Mapping):
            stack[:0] = list(node.values())
        elif isinstance(node, (list, tuple)):
            stack[:0] = list(node)
    raise ValueError("DataLoaderDispatcher found no tensor in the batch, so it cannot tell its size")


def _broadcast_tensors(data: Any) -> Any:
    """Broadcast every tensor of ``data`` from process 0, leaving other leaves as they are."""
    import torch.distributed as dist

    from accel_state.kept_works import wait_and_keep
    from accel_state.nested import recursively_apply

    def _one(tensor: torch.Tensor) -> torch.Tensor:
        tensor = tensor.contiguous()
        wait_and_keep(dist.broadcast(tensor, src=0, async_op=True))
        return tensor

    return recursively_apply(_one, data)


def _leaves(data: Any) -> list[torch.Tensor]:
    from accel_state.nested import recursively_apply

    found: list[torch.Tensor] = []
    recursively_apply(found.append, data)
    return found


def _rebuild_like(template: Any, leaves: list[torch.Tensor]) -> Any:
    """``template``'s structure with its tensors replaced, in order, by ``leaves`` (moved to their device)."""
    from accel_state.nested import recursively_apply

    remaining = iter(leaves)
    return recursively_apply(lambda t: next(remaining).to(t.device), template)


def _take(data: Any, index: torch.Tensor) -> Any:
    from accel_state.nested import recursively_apply

    return recursively_apply(lambda t: t[index.to(t.device)], data)


class DataLoaderDispatcher(DataLoaderStateMixin, DataLoader):
    """A ``DataLoader`` read by process 0 only; each batch is sent to every process, which keeps its slice.

    Without ``split_batches`` process 0 reads ``num_processes`` batches per step and concatenates them,
    so each process still gets batches of the loader's batch size; with it, one batch is cut in
    ``num_processes`` slices. The last batch is completed from the first one unless ``drop_last``.

    Args:
        dataset: the dataset (read on process 0 only).
        split_batches: cut each batch instead of concatenating ``num_processes`` of them.
        skip_batches: steps to skip at the start of every iteration.
        use_stateful_dataloader: build on torchdata's ``StatefulDataLoader``.
        slice_fn: ``slice_fn(batch, slice, process_index=..., num_processes=...)`` cutting a batch
            (default `accel_state.nested.slice_tensors()`; needed for batches holding non-tensors
            when there are several slices: with one process the batch, non-tensor leaves included, is
            passed on whole).
        torch_device_mesh: slices go to data-parallel ranks; tensor-parallel ranks get the same one.
        iteration: the epoch to start at.
        **kwargs: every other ``DataLoader`` argument.
    """

    def __init__(
        self,
        dataset: Any,
        split_batches: bool = False,
        skip_batches: int = 0,
        use_stateful_dataloader: bool = False,
        _drop_last: bool = False,
        _non_blocking: bool = False,
        slice_fn: Callable[..., Any] | None = None,
        torch_device_mesh: Any = None,
        iteration: int = 0,
        **kwargs: Any,
    ) -> None:
        from accel_state.nested import slice_tensors
        from accel_state.state import PartialState

        super().__init__(dataset, **kwargs)
        self.state = PartialState()
        self.split_batches = split_batches
        self.slice_fn = slice_tensors if slice_fn is None else slice_fn
        self._custom_slice = slice_fn is not None
        self.torch_device_mesh = torch_device_mesh
        self.num_slices, self.slice_index = data_parallel_coordinates(
            torch_device_mesh, self.state.num_processes, self.state.process_index
        )
        self.device = self.state.device
        self._init_state(None, None, skip_batches, _drop_last, _non_blocking)
        self.iteration = iteration
        self._first_leaves: list[torch.Tensor] | None = None
        self._resume_first: list[torch.Tensor] | None = None
        if split_batches:
            size = getattr(self.batch_sampler, "batch_size", None) or self.batch_size
            sharding.check_split(size, self.num_slices)

    # -- sizes ---------------------------------------------------------------------------------

    def _batches_per_step(self) -> int:
        return 1 if self.split_batches else self.num_slices

    @property
    def total_batch_size(self) -> int:
        """Number of samples in one step over all processes."""
        size = getattr(self.batch_sampler, "batch_size", None) or self.batch_size or 1
        return int(size) * (1 if self.split_batches else self.num_slices)

    def __len__(self) -> int:
        whole = super().__len__()
        if not self.split_batches:
            whole = whole // self.num_slices if self._drop_last else -(-whole // self.num_slices)
        return max(0, whole - self.skip_batches)

    def state_dict(self) -> dict[str, Any]:
        """Where this loader stands: epoch, batches already yielded in it, generator states."""
        skipping = self._active_skipping()
        if skipping is not None:
            return skipping.state_dict()
        state = super().state_dict()
        first = self._first_leaves if self._in_epoch else self._resume_first
        if state["batches_yielded"] and first is not None:
            # The last batch of the epoch is completed with these: a resumed run never sees them again.
            state["first_samples"] = [t.detach().cpu().clone() for t in first]
        return state

    def load_state_dict(self, state_dict: dict[str, Any], *, restore_position: bool = True) -> None:
        """Resume from `state_dict()` (see `DataLoaderStateMixin.load_state_dict()`).

        Args:
            state_dict: what `state_dict()` returned.
            restore_position: False replays the saved epoch from its first batch.
        """
        super().load_state_dict(state_dict, restore_position=restore_position)
        first = state_dict.get("first_samples")
        resumed = restore_position and state_dict["batches_yielded"]
        self._resume_first = list(first) if first is not None and resumed else None

    def _stateful_state(self) -> dict[str, Any]:
        if self.state.process_index != 0:
            return {}
        return super()._stateful_state()

    # -- reading on process 0 ------------------------------------------------------------------

    def _fetch(self, iterator: Iterator[Any]) -> Any:
        """The next global batch (None at the end); runs on process 0 only."""
        from accel_state.nested import concatenate

        if self.split_batches:
            try:
                batch = next(iterator)
            except StopIteration:
                return None
            self._check_leaves(batch)
            return batch
        parts = []
        for _ in range(self.num_slices):
            try:
                parts.append(next(iterator))
            except StopIteration:
                break
        if not parts or (len(parts) < self.num_slices and self._drop_last):
            return None
        self._check_leaves(parts[0])
        if len(parts) == 1:
            return parts[0]
        try:
            return concatenate(parts, dim=0)
        except (RuntimeError, TypeError, ValueError) as error:
            raise ValueError(
                f"DataLoaderDispatcher concatenates {self.num_slices} batches per step, but they cannot be joined "
                f"({error}). Batches of different shapes need dispatch_batches=False (each process reads its own "
                "batches) or split_batches=True (process 0 reads one full batch and cuts it)."
            ) from error

    def _check_leaves(self, batch: Any) -> None:
        """Refuse batches holding something the default slicing cannot cut (a clear error, not a wrong split)."""
        if self._custom_slice or self.num_slices == 1:
            return  # one slice: the batch is passed on whole, whatever its leaves
        leaf = _first_non_tensor(batch)
        if leaf is not None:
            raise ValueError(
                f"DataLoaderDispatcher cannot split this batch between processes: {sharding.describe_leaf(*leaf)}, "
                "not a tensor. Use dispatch_batches=False (DataLoaderConfiguration(dispatch_batches=False)) so "
                "each process reads its own batches, or pass slice_fn_for_dispatch=... to prepare_data_loader / "
                "Accelerator.prepare_data_loader to say how to cut it."
            )

    def _describe(self, batch: Any) -> Any:
        """What process 0 broadcasts about ``batch``: its structure."""
        from accel_state.nested import get_data_structure

        return ("batch", get_data_structure(batch))

    # -- iteration -----------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        return self._dispatch()

    def _dispatch(self) -> Iterator[Any]:
        from accel_state.nested import initialize_tensors, send_to_device
        from accel_state.operations import broadcast_object_list

        steps_to_skip = self._start_epoch()
        self._first_leaves = None
        main = self.state.process_index == 0
        distributed = self.state.num_processes > 1
        try:
            iterator: Iterator[Any] | None = None
            if main:
                discard = self._index_level_skip(steps_to_skip * self._batches_per_step())
                iterator = iter(super().__iter__())
                for _ in range(discard):
                    if next(iterator, None) is None:
                        break
            elif _needs_shared_seed(self.dataset):
                super().__iter__()
            steps_to_skip = 0
            first: Any = None
            current: Any = None
            pending_error: str | None = None
            if main:
                try:
                    current = self._fetch(iterator)  # type: ignore[arg-type]
                except Exception as error:  # every process must learn about it, or the others hang
                    pending_error = _message(error)
            while True:
                info: list[Any] = [None, True]
                if main:
                    if self._stateful:
                        self._take_snapshot()
                    if pending_error is not None:
                        info = [("error", pending_error), True]
                    elif current is None:
                        info = [("end", None), True]
                    else:
                        try:
                            following = self._fetch(iterator)  # type: ignore[arg-type]
                            info = [self._describe(current), following is None]
                        except Exception as error:  # every process must learn about it, or the others hang
                            info = [("error", _message(error)), True]
                            following = None
                if distributed:
                    broadcast_object_list(info)
                (kind, payload), is_last = info
                if kind == "end":
                    break
                if kind == "error":
                    raise ValueError(payload)
                batch = current if main else initialize_tensors(payload)
                batch = send_to_device(batch, self.device, non_blocking=self._non_blocking)
                if distributed:
                    batch = _broadcast_tensors(batch)
                if self.num_slices == 1 and not self._custom_slice:
                    # Nothing to cut: the batch goes on whole, non-tensor leaves included.
                    if is_last:
                        self.end_of_dataloader = True
                        if self.remainder < 0 and not self._drop_last:  # length unknown before: now it is
                            try:
                                self.remainder = _batch_size(batch) % self.total_batch_size
                            except (TypeError, ValueError):  # no tensor to count: nothing will be cut
                                self.remainder = 0
                    self._progress.yielded += 1
                    yield batch
                    if is_last:
                        break
                    if main:
                        current = following
                    continue
                observed = _batch_size(batch)
                if first is None and not self._drop_last:
                    if self._resume_first is not None:  # resumed mid-epoch: the epoch's first samples were saved
                        first = _rebuild_like(batch, self._resume_first)
                    else:
                        first = _take(batch, torch.arange(min(observed, self.num_slices)))
                    self._first_leaves = _leaves(first)
                    self._resume_first = None
                drop = self._drop_last or not is_last
                data_slice, padding = sharding.dispatch_slice(observed, self.num_slices, self.slice_index, drop)
                if padding:
                    from accel_state.nested import concatenate

                    filler = _take(first, torch.arange(padding) % _batch_size(first))
                    batch = concatenate([batch, filler], dim=0)
                batch = self.slice_fn(batch, data_slice, process_index=self.slice_index, num_processes=self.num_slices)
                if is_last:
                    self.end_of_dataloader = True
                    if self.remainder < 0 and not self._drop_last:  # length unknown before: now it is
                        self.remainder = observed % self.total_batch_size
                self._progress.yielded += 1
                yield batch
                if is_last:
                    break
                if main:
                    current = following
        except GeneratorExit:
            self.end()
            raise
        except BaseException:
            self.end()
            raise
        self._finish_epoch()


def _message(error: BaseException) -> str:
    return str(error) if isinstance(error, ValueError) else f"{type(error).__name__} while reading a batch: {error}"


def _needs_shared_seed(dataset: Any) -> bool:
    """DataPipes share a seed across ranks when their iterator is created, so every rank must create one."""
    try:
        from torch.utils.data.datapipes.datapipe import IterDataPipe, MapDataPipe
    except ImportError:  # pragma: no cover
        return False
    return isinstance(dataset, (IterDataPipe, MapDataPipe))
