"""``DataLoaderConfiguration``: how prepared data loaders shard, dispatch, seed and resume."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

STATEFUL_EXTRA_HINT = 'pip install "accel-data[torchdata]"'


def require_stateful_dataloader() -> None:
    """Raise a clear error when torchdata's ``StatefulDataLoader`` cannot be imported."""
    from accel_state import imports

    if not imports.is_torchdata_stateful_dataloader_available():
        raise ImportError(
            "use_stateful_dataloader=True needs torchdata>=0.8 (its StatefulDataLoader), which is not installed. "
            f"Install it with `{STATEFUL_EXTRA_HINT}`, or use a prepared loader (Accelerator.prepare or "
            "prepare_data_loader), whose use_stateful_dataloader=True works without torchdata."
        )


@dataclass
class DataLoaderConfiguration:
    """How ``Accelerator.prepare`` turns data loaders into distributed ones.

    Args:
        split_batches: the loader's batch size is the global one, cut in one slice per process
            (it must be a multiple of the number of processes); otherwise each process reads whole batches.
        dispatch_batches: process 0 reads every batch and sends each process its slice. ``None`` means
            yes for iterable datasets, no for map-style ones.
        even_batches: complete the last round with samples from the start so that every process gets
            the same number of batches (``gather_for_metrics`` drops the duplicates again).
        use_seedable_sampler: replace a ``RandomSampler`` by a :class:`SeedableRandomSampler`, whose order
            depends only on the seed and the epoch (reproducible and resumable).
        data_seed: seed of that sampler (default: torch's initial seed, as set by ``set_seed``).
        non_blocking: move batches to the device with ``non_blocking=True`` (useful with ``pin_memory``).
        use_stateful_dataloader: opt in to resuming mid-epoch: after ``Accelerator.load_state`` a prepared
            loader continues at the batch after the last one saved. Off (the default, as documented), it
            replays the interrupted epoch from its start, in the same order, and the script skips the
            batches it already used (``skip_first_batches`` or ``continue``). With torchdata installed
            (``pip install "accel-data[torchdata]"``) the loaders are built on its ``StatefulDataLoader``,
            whose state also covers workers and stateful datasets; without it, accel's own position is used.
    """

    split_batches: bool = False
    dispatch_batches: bool | None = None
    even_batches: bool = True
    use_seedable_sampler: bool = False
    data_seed: int | None = None
    non_blocking: bool = False
    use_stateful_dataloader: bool = False

    def __post_init__(self) -> None:
        for name in (
            "split_batches",
            "even_batches",
            "use_seedable_sampler",
            "non_blocking",
            "use_stateful_dataloader",
        ):
            _check_bool(name, getattr(self, name))
        if self.dispatch_batches is not None:
            _check_bool("dispatch_batches", self.dispatch_batches, "True, False or None (automatic)")
        if self.data_seed is not None and (isinstance(self.data_seed, bool) or not isinstance(self.data_seed, int)):
            raise TypeError(
                f"DataLoaderConfiguration.data_seed must be an int or None, got {type(self.data_seed).__name__} "
                f"({self.data_seed!r})"
            )
        if self.data_seed is not None and not self.use_seedable_sampler:
            # Only the seedable sampler reads it; say so instead of silently ignoring the seed.
            import warnings

            warnings.warn(
                "DataLoaderConfiguration.data_seed is only used with use_seedable_sampler=True; it is ignored.",
                stacklevel=3,
            )

    def to_dict(self) -> dict[str, Any]:
        """The settings as a plain dict (field name -> value)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _check_bool(name: str, value: Any, expected: str = "True or False") -> None:
    if not isinstance(value, bool):
        raise TypeError(f"DataLoaderConfiguration.{name} must be {expected}, got {type(value).__name__} ({value!r})")
