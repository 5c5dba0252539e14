"""The pipeline strategy: stages over the ``pp`` dimension, data parallelism over ``dp_replicate``
(replicas) or ``dp_shard`` (FSDP2).

The mesh is ``(pp, dp)``: processes ``r`` and ``r + dp`` are consecutive stages of one pipeline; the
``dp`` processes of a stage hold the same stage (whole, or sharded by FSDP2 with
``dp_shard_size``) and average its gradients.

Calling the prepared model with a target runs one schedule step, the forward *and* backward of every
micro-batch (that is what a pipeline schedule is), and returns the batch's loss on every rank;
``accelerator.backward(loss)`` then has nothing left to compute. The loss of each micro-batch is
divided by the micro-batch count and by the accumulation steps before its backward, so gradients are
those of the whole batch, accumulated over ``gradient_accumulation_steps`` batches exactly as without
a pipeline, and the optimizer steps once per global batch. Gradients are averaged over ``dp`` on sync
steps only (what DDP does, in one coalesced all-reduce per stage).
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from accel_state import kept_works
from accel_state.enums import PrecisionType
from accel_train.strategies.base import (
    CheckpointEntry,
    ParallelDims,
    Prepared,
    Strategy,
    parameter_locations,
    rebind_optimizer_parameters,
)
from accel_train.strategies.pipeline.checkpoint import (
    check_saved_groups,
    stage_groups_for_checkpoint,
    stage_groups_from_checkpoint,
)
from accel_train.strategies.pipeline.config import PipelineParallelConfig, PipelineSchedule
from accel_train.strategies.pipeline.split import stage_bounds, stage_module

__all__ = ["PipelineStrategy", "PipelinedModel"]

MODEL_ENTRY = "pytorch_model_pp"
OPTIMIZER_ENTRY = "optimizer_pp"
#: The pipeline's entries in a checkpoint folder: one DCP folder per model and per optimizer.
CHECKPOINT_ENTRIES: dict[str, CheckpointEntry] = {
    "model": CheckpointEntry(rf"^{MODEL_ENTRY}(?:_(\d+))?$", lambda i: f"{MODEL_ENTRY}_{i}", sharded=True),
    "optimizer": CheckpointEntry(rf"^{OPTIMIZER_ENTRY}_(\d+)$", lambda i: f"{OPTIMIZER_ENTRY}_{i}", sharded=True),
}


class _ScaledLoss:
    """The loss function the schedule calls per micro-batch: records the loss, returns it scaled."""

    def __init__(self) -> None:
        self.fn: Callable[..., Any] | None = None
        self.scale = 1.0
        self.record: list[torch.Tensor] = []

    def __call__(self, output: Any, target: Any) -> torch.Tensor:
        assert self.fn is not None  # set before every step
        loss = self.fn(output, target)
        self.record.append(loss.detach())
        return loss * self.scale


class PipelinedModel(torch.nn.Module):
    """This process's stage of a pipelined model.

    ``model(inputs, target=labels)`` trains: it runs one schedule step (forward and backward of every
    micro-batch) and returns the batch's mean loss on every rank. ``model(inputs)`` evaluates: forward
    only, the last stage's output given to every rank. Every process of the pipeline calls it with the
    same batch (the data loader gives pipeline peers the same batches).
    """

    def __init__(self, module: torch.nn.Module, strategy: PipelineStrategy, stage_index: int) -> None:
        super().__init__()
        self.module = module
        self.stage_index = stage_index
        object.__setattr__(self, "_strategy", strategy)

    def forward(self, *args: Any, target: Any = None, loss_fn: Callable[..., Any] | None = None, **kwargs: Any) -> Any:
        strategy: PipelineStrategy = self.__dict__["_strategy"]
        return strategy.run(self, args, kwargs, target, loss_fn)


class PipelineStrategy(Strategy):
    """Pipeline parallelism (``torch.distributed.pipelining``) with data parallelism over one mesh."""

    name = "pipeline"
    is_sharded = True
    #: fp16 needs a gradient scaler, which the pipeline schedules do not apply
    precisions = frozenset({PrecisionType.NO, PrecisionType.BF16, PrecisionType.FP8})

    def __init__(self, state: Any, precision: Any, checkpoint_io: Any = None, handlers: Any = None) -> None:
        super().__init__(state, precision, checkpoint_io, handlers)
        self.config = state.parallelism_config
        self.config.validate_world_size(state.num_processes)
        self.pp_config: PipelineParallelConfig = self.config.pp_handler or PipelineParallelConfig()
        self.num_stages = int(self.config.pp_size)
        self.sharded = int(self.config.dp_shard_size) > 1
        self.dp_dim = "dp_shard" if self.sharded else "dp_replicate"
        self.dp_size = int(self.config.dp_shard_size if self.sharded else self.config.dp_replicate_size)
        from accel_train.strategies.mesh import build_mesh

        self._mesh = build_mesh(state.device.type, [("pp", self.num_stages), (self.dp_dim, self.dp_size)])
        self.config._device_mesh = self._mesh
        self.pp_group = self._mesh["pp"].get_group()
        self.dp_group = self._mesh[self.dp_dim].get_group()
        self.stage_index = self._mesh["pp"].get_local_rank()
        self.dp_rank = self._mesh[self.dp_dim].get_local_rank()
        self._models: list[PipelinedModel] = []
        self._dropped: set[int] = set()  # ids of parameters that live on other stages
        self._schedules: dict[tuple[int, int, bool], Any] = {}
        self._last_loss: torch.Tensor | None = None

    @classmethod
    def validate(cls, state: Any, precision_cls: Any, mode: str) -> None:
        """Refuse, by name, what the pipeline strategy does not combine with.

        Raises:
            NotImplementedError: dp_shard / tp / cp / sp sizes above 1, or fp16 (no gradient scaler).
            ValueError: a DeepSpeed, FSDP or Megatron-LM plugin, or sizes that do not multiply to the world.
        """
        config = state.parallelism_config
        config.validate_world_size(state.num_processes)
        others = {name: getattr(config, name) for name in ("tp_size", "cp_size", "sp_size")}
        used = {name: size for name, size in others.items() if size > 1}
        if used:
            raise NotImplementedError(
                f"pipeline parallelism (pp_size={config.pp_size}) combines with dp_replicate_size or dp_shard_size "
                f"only; {used} are not supported with it yet: set them to 1"
            )
        if config.dp_replicate_size > 1 and config.dp_shard_size > 1:
            raise NotImplementedError(
                f"pipeline parallelism combines with one data-parallel dimension: dp_replicate_size="
                f"{config.dp_replicate_size} and dp_shard_size={config.dp_shard_size} are both above 1; keep one"
            )
        for plugin in ("deepspeed_plugins", "fsdp_plugin", "megatron_lm_plugin"):
            if getattr(state, plugin, None):
                raise ValueError(
                    f"ParallelismConfig(pp_size={config.pp_size}) runs torch's pipelining; it cannot be combined "
                    f"with the {plugin}. Remove the plugin or set pp_size=1"
                )
        if mode == "fp16":  # also left out of `precisions`, the table the connector checks
            raise ValueError(
                "mixed_precision='fp16' needs a gradient scaler, which the pipeline schedules do not apply; "
                "use 'bf16' or 'no' with pp_size > 1"
            )

    # -- facts ----------------------------------------------------------------------------------------

    @property
    def device_mesh(self) -> Any:
        return self._mesh

    @property
    def is_composable_parallelism_enabled(self) -> bool:
        return True

    @property
    def is_first_stage(self) -> bool:
        return self.stage_index == 0

    @property
    def is_last_stage(self) -> bool:
        return self.stage_index == self.num_stages - 1

    @property
    def parallel_dims(self) -> ParallelDims:
        if self.sharded:
            dims = ParallelDims(dp_shard_size=self.dp_size, dp_shard_rank=self.dp_rank)
        else:
            dims = ParallelDims(dp_replicate_size=self.dp_size, dp_replicate_rank=self.dp_rank)
        return _with_pp(dims, self.num_stages, self.stage_index)

    # -- set-up ---------------------------------------------------------------------------------------

    def setup(
        self,
        models: Sequence[torch.nn.Module],
        optimizers: Sequence[torch.optim.Optimizer],
        schedulers: Sequence[Any],
        device_placement: Sequence[bool],
        evaluation_mode: bool = False,
        data_loaders: Sequence[Any] = (),
    ) -> Prepared:
        # FSDP2 replaces parameters by sharded ones: remember each one's name to rebind the optimizers.
        names = parameter_locations(models)
        # The base set-up: each stage cut and placed, each optimizer trimmed to its stage.
        prepared = super().setup(models, optimizers, schedulers, device_placement, evaluation_mode, data_loaders)
        if self.sharded:
            new_params = [dict(m.get_submodule("module").named_parameters()) for m in prepared.models]
            for optimizer in prepared.optimizers:
                rebind_optimizer_parameters(optimizer, names, new_params)
        return prepared

    def setup_model(
        self, model: torch.nn.Module, device_placement: bool = True, evaluation_mode: bool = False
    ) -> torch.nn.Module:
        """Cut ``model`` into stages and keep this process's stage (placed, converted for the precision)."""
        bounds = stage_bounds(model, self.num_stages, self.pp_config.split_points)
        stage: torch.nn.Module = stage_module(model, bounds, self.stage_index)
        kept = {id(p) for p in stage.parameters()}
        self._dropped.update(id(p) for p in model.parameters() if id(p) not in kept)
        if device_placement:
            stage = stage.to(self.device)
        stage = self.precision.convert_module(stage)
        if self.sharded:
            from torch.distributed.fsdp import fully_shard

            # One FSDP2 unit per stage, kept gathered between micro-batches (the schedule runs several).
            fully_shard(stage, mesh=self._mesh["dp_shard"], reshard_after_forward=False)  # in place
        pipelined = PipelinedModel(self.compile(stage), self, self.stage_index)
        self._models.append(pipelined)
        return pipelined

    def setup_optimizer(self, optimizer: torch.optim.Optimizer, models: Sequence[torch.nn.Module]) -> Any:
        """Drop from the optimizer the parameters that live on other stages (and their state)."""
        for group in optimizer.param_groups:
            kept = []
            for param in group["params"]:
                if id(param) in self._dropped:
                    optimizer.state.pop(param, None)
                else:
                    kept.append(param)
            group["params"] = kept
        return optimizer

    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model

    # -- the schedule step ----------------------------------------------------------------------------

    def _schedule(self, model: PipelinedModel, microbatches: int, with_loss: bool) -> tuple[Any, _ScaledLoss]:
        """The schedule of ``model`` for this micro-batch count; one with a loss, one forward-only for outputs."""
        key = (id(model), microbatches, with_loss)
        if key not in self._schedules:
            from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

            from accel_bigmodel.inference import match_init_p2p_dtypes

            stage = PipelineStage(model.module, self.stage_index, self.num_stages, self.device, group=self.pp_group)
            match_init_p2p_dtypes(stage)  # torch 2.9 on gloo: see accel_bigmodel.inference
            cls = ScheduleGPipe if self.pp_config.schedule is PipelineSchedule.GPIPE or not with_loss else Schedule1F1B
            loss = _ScaledLoss()
            # Gradients are scaled in the loss (scale_grads would also divide gradients accumulated before).
            schedule = cls(stage, n_microbatches=microbatches, loss_fn=loss if with_loss else None, scale_grads=False)
            self._schedules[key] = (schedule, loss)
        return self._schedules[key]  # type: ignore[no-any-return]

    def run(
        self,
        model: PipelinedModel,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        target: Any,
        loss_fn: Callable[..., Any] | None,
    ) -> Any:
        """One schedule step of ``model`` (see `PipelinedModel`)."""
        from accel_state.state import GradientState

        microbatches = self.pp_config.num_microbatches or self.num_stages
        batch = args[0] if args else target
        if isinstance(batch, torch.Tensor) and batch.shape[0] % microbatches:
            raise ValueError(
                f"the batch has {batch.shape[0]} samples, which do not split into {microbatches} equal micro-batches; "
                "use a batch size that is a multiple of PipelineParallelConfig.num_microbatches"
            )
        schedule, scaled = self._schedule(model, microbatches, with_loss=target is not None)
        training = target is not None and torch.is_grad_enabled() and model.training
        scaled.fn = loss_fn or self.pp_config.loss_fn
        if target is not None and scaled.fn is None:
            raise ValueError(
                "pipeline parallelism computes the loss on the last stage: give loss_fn in "
                "PipelineParallelConfig(loss_fn=...) or call model(inputs, target=labels, loss_fn=...)"
            )
        gradient_state = GradientState()
        scaled.scale = 1.0 / (microbatches * gradient_state.num_steps) if training else 1.0
        scaled.record = []
        step = schedule.step if training or target is None else schedule.eval
        stage_args = args if self.is_first_stage else ()
        stage_kwargs = kwargs if self.is_first_stage else {}
        stage_target = target if self.is_last_stage else None
        losses: list[Any] | None = [] if (self.is_last_stage and target is not None) else None
        output = step(*stage_args, target=stage_target, losses=losses, **stage_kwargs)
        if target is None:
            return self._broadcast_output(output)
        # The last ``microbatches`` calls are the step's (torch's first step also calls the loss once to
        # infer shapes, without backward).
        record = scaled.record[-microbatches:]
        loss = torch.stack(record).mean() if self.is_last_stage else torch.zeros((), device=self.device)
        loss = self._from_last_stage(loss.float().contiguous())
        if training and gradient_state.sync_gradients:
            self.all_reduce_gradients(model)
        self._last_loss = loss
        return loss

    def _last_stage_rank(self) -> int:
        return int(dist.get_global_rank(self.pp_group, self.num_stages - 1))

    def _from_last_stage(self, tensor: torch.Tensor) -> torch.Tensor:
        kept_works.wait_and_keep(
            dist.broadcast(tensor, src=self._last_stage_rank(), group=self.pp_group, async_op=True)
        )
        return tensor

    def _broadcast_output(self, output: Any) -> Any:
        """The last stage's output (a tensor) given to every stage."""
        meta = [(tuple(output.shape), str(output.dtype).removeprefix("torch.")) if self.is_last_stage else None]
        kept_works.broadcast_object_list(meta, src=self._last_stage_rank(), group=self.pp_group)
        shape, dtype = meta[0]  # type: ignore[misc]
        if not self.is_last_stage:
            output = torch.empty(shape, dtype=getattr(torch, dtype), device=self.device)
        return self._from_last_stage(output.contiguous())

    def all_reduce_gradients(self, model: PipelinedModel) -> None:
        """Average this stage's gradients over the data-parallel processes (one coalesced all-reduce)."""
        if self.dp_size == 1 or self.sharded:  # FSDP2 reduce-scatters in the backward
            return
        from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

        grads = [p.grad for p in model.module.parameters() if p.grad is not None]
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for grad in grads:
            by_dtype.setdefault(grad.dtype, []).append(grad)
        for tensors in by_dtype.values():
            flat = _flatten_dense_tensors(tensors)
            kept_works.wait_and_keep(dist.all_reduce(flat, group=self.dp_group, async_op=True))
            flat.div_(self.dp_size)
            for grad, synced in zip(tensors, _unflatten_dense_tensors(flat, tensors)):
                grad.copy_(synced)

    # -- training step ----------------------------------------------------------------------------------

    def backward(self, loss: torch.Tensor, accumulation_steps: int = 1, **kwargs: Any) -> None:
        """Nothing left to compute: the schedule step that gave ``loss`` ran the backward.

        Raises:
            ValueError: ``loss`` is not the loss the pipelined model returned last.
        """
        if loss is not self._last_loss:
            raise ValueError(
                "with pipeline parallelism the backward runs inside the schedule: pass to accelerator.backward the "
                "loss returned by the prepared model called with target= (model(inputs, target=labels))"
            )
        self._last_loss = None

    def clip_grad_norm_(
        self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float, optimizers: Iterable[Any]
    ) -> torch.Tensor:
        """Clip by the norm over every stage's gradients (each stage holds its own parameters)."""
        grads = [p.grad for p in parameters if p.grad is not None]
        norm_type = float(norm_type)
        if grads:
            norms = [torch.linalg.vector_norm(g, norm_type) for g in grads]
            norms = [n.full_tensor() if hasattr(n, "full_tensor") else n for n in norms]  # FSDP2 shards
            local = torch.linalg.vector_norm(torch.stack(norms), norm_type)
        else:
            local = torch.zeros((), device=self.device)
        local = local.float()
        if math.isinf(norm_type):
            kept_works.wait_and_keep(dist.all_reduce(local, op=dist.ReduceOp.MAX, group=self.pp_group, async_op=True))
            total = local
        else:
            powered = local**norm_type
            kept_works.wait_and_keep(dist.all_reduce(powered, group=self.pp_group, async_op=True))
            total = powered ** (1.0 / norm_type)
        coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for grad in grads:
            grad.mul_(coefficient.to(grad.device, grad.dtype))
        return total

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
        """Gradients are averaged after the schedule step on sync steps only: nothing to switch off."""
        return contextlib.nullcontext()

    # -- state ----------------------------------------------------------------------------------------

    def unwrap_model(self, model: Any, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True) -> Any:
        """This process's stage (an ``nn.Sequential`` of the model's children, with their names)."""
        if isinstance(model, PipelinedModel):
            model = model.module
        return super().unwrap_model(model, keep_fp32_wrapper, keep_torch_compile)

    def model_state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, Any]:
        """The whole model's state dict on every rank (each stage sends its part); call it on every rank."""
        stage = self.unwrap_model(model, keep_torch_compile=False)
        local = {k: _full(v).detach() for k, v in stage.state_dict().items()}
        full: dict[str, Any] = {}
        for source in range(self.num_stages):
            meta = [[(k, tuple(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in local.items()]]
            src = int(dist.get_global_rank(self.pp_group, source))
            kept_works.broadcast_object_list(meta, src=src, group=self.pp_group)
            for key, shape, dtype in meta[0]:
                if source == self.stage_index:
                    tensor = local[key].contiguous()
                else:
                    tensor = torch.empty(shape, dtype=getattr(torch, dtype), device=self.device)
                kept_works.wait_and_keep(dist.broadcast(tensor, src=src, group=self.pp_group, async_op=True))
                full[key] = tensor.cpu()
        return full

    def _stage_of(self, optimizer: Any) -> torch.nn.Module:
        inner = optimizer.optimizer if hasattr(optimizer, "optimizer") else optimizer
        params = {id(p) for group in inner.param_groups for p in group["params"]}
        for model in self._models:
            if any(id(p) in params for p in model.module.parameters()):
                return model.module
        raise ValueError("this optimizer holds parameters of no model prepared with the pipeline strategy")

    def optimizer_state_dict(self, optimizer: Any) -> dict[str, Any]:
        """This stage's optimizer state, keyed by parameter name."""
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        inner = optimizer.optimizer if hasattr(optimizer, "optimizer") else optimizer
        return get_optimizer_state_dict(self._stage_of(optimizer), inner)

    def checkpoint_entries(self) -> dict[str, CheckpointEntry]:
        return dict(CHECKPOINT_ENTRIES)

    def checkpoint_weights(self, model: torch.nn.Module) -> dict[str, Any] | None:
        return None  # every stage writes its part

    def save_model_checkpoint(
        self, model: torch.nn.Module, weights: Any, folder: str, index: int, safe_serialization: bool, is_writer: bool
    ) -> str:
        """Each stage writes its parameters (under their names in the whole model) into one DCP folder,
        through the checkpoint I/O (collective)."""
        name = self.checkpoint_entries()["model"].name(index)
        stage = self.unwrap_model(model, keep_torch_compile=False)
        self.checkpoint_io.save_sharded(stage.state_dict(), os.path.join(folder, name))
        return name

    def load_model_checkpoint(
        self, model: torch.nn.Module, folder: str, entry: str, device: Any, strict: bool = True
    ) -> None:
        """Read this stage's parameters from the DCP folder ``folder/entry`` with the checkpoint I/O's
        allow-list reader (collective); the stage split may differ from the one that saved."""
        stage = self.unwrap_model(model, keep_torch_compile=False)
        state = stage.state_dict()
        self.checkpoint_io.load_sharded(state, os.path.join(folder, entry))
        stage.load_state_dict(state, strict=strict)

    def save_optimizer_checkpoint(self, optimizer: Any, folder: str, index: int, is_writer: bool) -> str:
        """This stage's optimizer state into one DCP folder shared by the stages (collective).

        The hyper-parameters of each parameter group are written without the group's parameter names
        (`stage_groups_for_checkpoint()`): every stage holds the same groups with other parameters, and
        DCP keeps one copy of an item that several processes write under one key.
        """
        name = self.checkpoint_entries()["optimizer"].name(index)
        state = stage_groups_for_checkpoint(self.optimizer_state_dict(optimizer))
        self.checkpoint_io.save_sharded(state, os.path.join(folder, name))
        return name

    def load_optimizer_checkpoint(self, optimizer: Any, folder: str, index: int, map_location: Any) -> None:
        """Restore this stage's optimizer state and its groups' hyper-parameters (collective)."""
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        inner = optimizer.optimizer if hasattr(optimizer, "optimizer") else optimizer
        stage = self._stage_of(optimizer)
        path = os.path.join(folder, self.checkpoint_entries()["optimizer"].name(index))
        current = self.optimizer_state_dict(optimizer)
        metadata = self.checkpoint_io.sharded_metadata(path)
        state = check_saved_groups(metadata, stage_groups_for_checkpoint(current), path)
        self.checkpoint_io.load_sharded(state, path)
        set_optimizer_state_dict(stage, inner, stage_groups_from_checkpoint(state, current))


def _full(tensor: Any) -> Any:
    """The whole tensor of an FSDP2 shard (the tensor itself otherwise)."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def _with_pp(dims: ParallelDims, pp_size: int, pp_rank: int) -> ParallelDims:
    """``dims`` with the pipeline dimension set (on a ``ParallelDims`` that has one)."""
    import dataclasses

    names = {f.name for f in dataclasses.fields(dims)}
    if "pp_size" in names:
        return dataclasses.replace(dims, pp_size=pp_size, pp_rank=pp_rank)
    return dims
