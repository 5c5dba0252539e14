"""What ``prepare`` returns under Megatron-LM: the model (one train step per call), optimizer, scheduler.

Calling the prepared model in training mode runs megatron-core's ``forward_backward_func`` over the
batch's micro-batches (forward *and* backward, as a pipeline schedule must) and returns an output with
``loss`` averaged over the data-parallel group, as the guide documents; ``accelerator.backward`` then
has nothing left to compute. In eval mode it runs forward only. The optimizer's ``step`` is
megatron-core's (gradient clipping by ``MegatronLMPlugin.gradient_clipping`` included); the scheduler
advances by one optimizer step.

Nothing in this module runs without CUDA (megatron-core's layers call it directly).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["MegatronEngine", "MegatronOptimizerWrapper", "MegatronOutput", "MegatronSchedulerWrapper"]


@dataclass
class MegatronOutput:
    """What the prepared model returns: the loss (on every rank), and logits when asked for."""

    loss: torch.Tensor
    logits: Any = None


def _micro_batches(batch: dict[str, Any], count: int) -> list[dict[str, Any]]:
    size = next(iter(batch.values())).shape[0]
    if size % count:
        raise ValueError(
            f"the batch has {size} samples, which do not split into num_micro_batches={count} equal micro-batches"
        )
    step = size // count
    return [{k: v[i * step : (i + 1) * step] for k, v in batch.items()} for i in range(count)]


class MegatronEngine(torch.nn.Module):
    """The megatron-core model chunks of this rank, trained one step per call.

    Args:
        chunks: the model chunks (megatron-core ``DistributedDataParallel`` each; several with virtual stages).
        train_step: the `AbstractTrainStep` in use.
        plugin: the ``MegatronLMPlugin``.
        seq_length: the sequence length given to the schedule.
    """

    def __init__(self, chunks: list[torch.nn.Module], train_step: Any, plugin: Any, seq_length: int) -> None:
        super().__init__()
        self.module = torch.nn.ModuleList(chunks)
        self.train_step = train_step
        self.plugin = plugin
        self.seq_length = seq_length
        self.last_loss: torch.Tensor | None = None

    def forward(self, **batch: Any) -> MegatronOutput:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        count = self.plugin.num_micro_batches or 1
        micro = _micro_batches(batch, count)
        forward_only = not (self.training and torch.is_grad_enabled())
        iterators: Iterator[Any] | list[Iterator[Any]] = iter(micro)
        if len(self.module) > 1:
            iterators = [iter(micro) for _ in self.module]
        losses = get_forward_backward_func()(
            forward_step_func=self.train_step.get_forward_step_func(),
            data_iterator=iterators,
            model=list(self.module),
            num_microbatches=count,
            seq_length=self.seq_length,
            micro_batch_size=micro[0]["input_ids"].shape[0],
            forward_only=forward_only,
        )
        loss = self._reported_loss(losses)
        self.last_loss = loss
        return MegatronOutput(loss=loss)

    def _reported_loss(self, losses: list[dict[str, Any]]) -> torch.Tensor:
        """The mean ``"lm loss"`` over micro-batches, sent from the last pipeline stage to every stage."""
        import torch.distributed as dist
        from megatron.core import parallel_state

        device = torch.device("cuda", torch.cuda.current_device())
        value = torch.zeros((), device=device)
        if parallel_state.is_pipeline_last_stage(ignore_virtual=True) and losses:
            value = torch.stack([item["lm loss"].float() for item in losses]).mean()
        if parallel_state.get_pipeline_model_parallel_world_size() > 1:
            src = parallel_state.get_pipeline_model_parallel_last_rank()
            dist.broadcast(value, src=src, group=parallel_state.get_pipeline_model_parallel_group())
        return value

    def zero_grad_buffer(self) -> None:
        chunk: Any
        for chunk in self.module:
            chunk.zero_grad_buffer()

    def sharded_state_dict(self) -> dict[str, Any]:
        """The chunks' sharded state dict (megatron-core distributed checkpointing)."""
        chunks: list[Any] = list(self.module)
        if len(chunks) == 1:
            return chunks[0].sharded_state_dict()  # type: ignore[no-any-return]
        return {f"model{i}": chunk.sharded_state_dict() for i, chunk in enumerate(chunks)}


class MegatronOptimizerWrapper:
    """The prepared optimizer: megatron-core's ``step`` (clips, skips on overflow), zeroing the grad buffers.

    Args:
        optimizer: megatron-core's ``MegatronOptimizer``.
        engine: the `MegatronEngine` whose gradient buffers it zeroes.
    """

    def __init__(self, optimizer: Any, engine: MegatronEngine) -> None:
        self.optimizer = optimizer
        self.engine = engine
        self.grad_norm: Any = None
        self.skipped = False

    @property
    def param_groups(self) -> Any:
        return self.optimizer.param_groups

    def step(self, closure: Any = None) -> None:
        success, grad_norm, _ = self.optimizer.step()
        self.grad_norm = grad_norm
        self.skipped = not success

    @property
    def step_was_skipped(self) -> bool:
        return self.skipped

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.engine.zero_grad_buffer()
        self.optimizer.zero_grad(set_to_none)

    def state_dict(self) -> Any:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: Any) -> None:
        self.optimizer.load_state_dict(state_dict)


class MegatronSchedulerWrapper:
    """The prepared scheduler: megatron-core's ``OptimizerParamScheduler``, one increment per step."""

    def __init__(self, scheduler: Any, optimizer: MegatronOptimizerWrapper) -> None:
        self.scheduler = scheduler
        self.optimizer = optimizer

    def step(self, *args: Any, **kwargs: Any) -> None:
        if not self.optimizer.skipped:
            self.scheduler.step(increment=1)

    def get_last_lr(self) -> list[float]:
        return [group["lr"] for group in self.optimizer.param_groups]

    def state_dict(self) -> Any:
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: Any) -> None:
        self.scheduler.load_state_dict(state_dict)
