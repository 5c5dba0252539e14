"""``DataLoaderConfiguration``: how prepared data loaders shard, dispatch, seed and resume."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from accel_state.install_hints import install_hint

#: How to install the ``torchdata`` extra of accel-data (torchdata's ``StatefulDataLoader``).
STATEFUL_EXTRA_HINT = install_hint("accel-data", "torchdata")


def require_stateful_dataloader() -> None:
    """Raise a clear error when torchdata's ``StatefulDataLoader`` cannot be imported."""
    from accel_state import imports

    if not imports.is_torchdata_stateful_dataloader_available():
        raise ImportError(
            "use_stateful_dataloader=True needs torchdata>=0.8 (its StatefulDataLoader), which is not installed. "
            "Use a prepared loader (Accelerator.prepare or prepare_data_loader), whose "
            f"use_stateful_dataloader=True works without torchdata, or install it: {STATEFUL_EXTRA_HINT}."
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
        use_seedable_sampler: replace a ``RandomSampler`` by a `SeedableRandomSampler`, whose order
            depends only on the seed and the epoch (reproducible and resumable).
        data_seed: seed of that sampler (default: torch's initial seed, as set by ``set_seed``).
        non_blocking: move batches to the device with ``non_blocking=True`` (useful with ``pin_memory``).
        use_stateful_dataloader: opt in to resuming mid-epoch: after ``Accelerator.load_state`` a prepared
            loader continues at the batch after the last one saved. Off (the default, as documented),
            ``load_state`` leaves the loader as it was prepared: its next iteration starts an epoch whose
            order comes from the random states just restored, and the script skips the batches it
            already used (``skip_first_batches`` or ``continue``). With torchdata installed
            (the ``torchdata`` extra of accel-data) the loaders are built on its ``StatefulDataLoader``,
            whose state also covers workers and stateful datasets; without it, accel's own position is used.
        replay_epoch_on_resume: accel's opt-in for scripts that skip by hand: after ``load_state`` a
            loader without ``use_stateful_dataloader`` gets back the interrupted epoch's number and
            shuffle order and replays it from its first batch without drawing from torch's generator
            again, so ``skip_first_batches(loader, n)`` or a ``continue`` over the first ``n`` steps
            resumes exactly where the uninterrupted run was (the documented system has no such option:
            its resumed loader starts at epoch 0 and draws a new order). Cannot be combined with
            ``use_stateful_dataloader``, which continues at the saved batch by itself.
    """

    split_batches: bool = False
    dispatch_batches: bool | None = None
    even_batches: bool = True
    use_seedable_sampler: bool = False
    data_seed: int | None = None
    non_blocking: bool = False
    use_stateful_dataloader: bool = False
    replay_epoch_on_resume: bool = False

    def __post_init__(self) -> None:
        for name in (
            "split_batches",
            "even_batches",
            "use_seedable_sampler",
            "non_blocking",
            "use_stateful_dataloader",
            "replay_epoch_on_resume",
        ):
            _check_bool(name, getattr(self, name))
        check_resume_options("DataLoaderConfiguration", self.use_stateful_dataloader, self.replay_epoch_on_resume)
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


def check_resume_options(where: str, use_stateful_dataloader: bool, replay_epoch_on_resume: bool) -> None:
    """Refuse the two resume opt-ins together: each defines what ``load_state`` does with a loader.

    Args:
        where: what received them (named in the error).
        use_stateful_dataloader: the loader continues at the saved batch.
        replay_epoch_on_resume: the loader replays the saved epoch for a script that skips by hand.
    """
    if use_stateful_dataloader and replay_epoch_on_resume:
        raise ValueError(
            f"{where}: use_stateful_dataloader=True and replay_epoch_on_resume=True cannot be combined: the "
            "first continues at the saved batch by itself, the second replays the epoch for a script that skips "
            "the seen batches by hand. Keep the one your script is written for."
        )


def _check_bool(name: str, value: Any, expected: str = "True or False") -> None:
    if not isinstance(value, bool):
        raise TypeError(f"DataLoaderConfiguration.{name} must be {expected}, got {type(value).__name__} ({value!r})")
