"""Documented Megatron-LM helpers: the dummy scheduler and data loader, and data-parallel loss averaging."""

from __future__ import annotations

from typing import Any

from accel_train.scheduler import StandInScheduler

__all__ = [
    "MegatronLMDummyDataLoader",
    "MegatronLMDummyScheduler",
    "avg_losses_across_data_parallel_group",
    "gather_across_data_parallel_groups",
]


class MegatronLMDummyScheduler(StandInScheduler):
    """Stands for the learning-rate scheduler Megatron-LM builds itself (``OptimizerParamScheduler``).

    ``prepare`` replaces it with megatron-core's scheduler over megatron-core's optimizer.

    Args:
        optimizer: the optimizer it schedules.
        total_num_steps: optimizer steps of the whole run (length of the decay).
        warmup_num_steps: steps of linear warm-up.
        **kwargs: kept in `kwargs` (other scheduler settings).
    """

    replaced_by = "the scheduler Megatron-LM builds"

    def __init__(
        self, optimizer: Any, total_num_steps: int | None = None, warmup_num_steps: int = 0, **kwargs: Any
    ) -> None:
        if total_num_steps is not None and total_num_steps < 1:
            raise ValueError(f"MegatronLMDummyScheduler.total_num_steps must be >= 1, got {total_num_steps}")
        if warmup_num_steps < 0:
            raise ValueError(f"MegatronLMDummyScheduler.warmup_num_steps must be >= 0, got {warmup_num_steps}")
        super().__init__(optimizer, total_num_steps, warmup_num_steps, **kwargs)


class MegatronLMDummyDataLoader:
    """Stands for the data loaders of Megatron-LM indexed datasets (``megatron_dataset_flag``).

    Holds the dataset settings (``data_path``, ``splits_string``, ``seq_length``, ``micro_batch_size``,
    ...). Prepared three times, it gives the train, validation and test loaders.

    Args:
        **dataset_kwargs: the dataset settings, under Megatron-LM's names.
    """

    def __init__(self, **dataset_kwargs: Any) -> None:
        self.dataset_args = dict(dataset_kwargs)

    def __getattr__(self, name: str) -> Any:
        args = self.__dict__.get("dataset_args", {})
        if name in args:
            return args[name]
        raise AttributeError(name)

    def set_megatron_data_args(self) -> dict[str, Any]:
        """The settings as the ``MegatronLMPlugin`` takes them (``seq_length`` and the rest)."""
        return dict(self.dataset_args)


def avg_losses_across_data_parallel_group(losses: list[Any]) -> Any:
    """The given losses averaged over the data-parallel group (one tensor of ``len(losses)`` values).

    Args:
        losses: The losses (scalar tensors) of this rank.
    """
    import torch
    import torch.distributed as dist

    averaged = torch.cat([loss.clone().detach().view(1) for loss in losses])
    if dist.is_available() and dist.is_initialized():
        from megatron.core import parallel_state

        group = parallel_state.get_data_parallel_group()
        dist.all_reduce(averaged, group=group)
        averaged = averaged / dist.get_world_size(group=group)
    return averaged


def gather_across_data_parallel_groups(tensor: Any) -> Any:
    """``tensor`` from every data-parallel rank, concatenated along the first dimension.

    Args:
        tensor: This rank's tensor.
    """
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return tensor
    from megatron.core import parallel_state

    group = parallel_state.get_data_parallel_group()
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group=group))]
    dist.all_gather(parts, tensor.contiguous(), group=group)
    return torch.cat(parts, dim=0)
