"""The ND-parallel strategy: a device mesh of data-replicate x data-shard x expert x context x tensor
parallel dimensions, built from a ``ParallelismConfig``.

A model is set up in a fixed order (the order in which the pieces compose):

1. placed on the device and converted for the precision;
2. tensor parallel over ``tp``: the modules of the plan become DTensor-sharded (`accel_train.strategies.nd.tensor_parallel`);
   expert parallel over ``ep``: each expert module's experts are split over the ``ep`` processes and its
   tokens travel by all-to-all (`accel_train.strategies.nd.expert_parallel`);
3. activation checkpointing of the blocks, when the FSDP plugin asks for it;
4. ``torch.compile``, when the dynamo plugin asks for it;
5. FSDP2 (``fully_shard``) over ``dp_shard`` x ``ep`` x ``cp`` — the expert modules first (over the ranks
   holding the same experts, ``dp_replicate`` x ``dp_shard``), each unit (the plugin's auto-wrap policy,
   else the repeated blocks), then the root — with ``dp_replicate`` as the replicate dimension of HSDP.

Steps 3 and 5 are the FSDP strategy's own FSDP2 path (`accel_train.strategies.fsdp.fsdp2`): every
FSDP plugin setting means the same here, or is refused by name (``cpu_ram_efficient_loading``, a
``state_dict_type`` other than sharded).

Data loaders shard over the data-parallel ranks only (``parallel_dims``): tensor- and context-parallel
peers get the same batches. State dicts and checkpoints go through ``torch.distributed.checkpoint``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from accel_train.strategies.base import (
    CheckpointEntry,
    ParallelDims,
    Strategy,
    parameter_locations,
    rebind_optimizer_parameters,
)
from accel_train.strategies.fsdp import fsdp2
from accel_train.strategies.fsdp import state as fsdp_state
from accel_train.strategies.fsdp.plugin import setting_name
from accel_train.strategies.fsdp.wrap import canonical_name

__all__ = ["NDParallelStrategy"]


class NDParallelStrategy(Strategy):
    """Tensor, context and (sharded or replicated) data parallelism over one ``DeviceMesh``."""

    name = "nd_parallel"
    is_sharded = True

    def __init__(self, state: Any, precision: Any, checkpoint_io: Any = None, handlers: Any = None) -> None:
        super().__init__(state, precision, checkpoint_io, handlers)
        self.config = state.parallelism_config
        self.config.validate_world_size(state.num_processes)
        self._mesh = self.config.build_device_mesh(state.device.type)
        self._models: list[torch.nn.Module] = []
        self._expert_counts: dict[str, torch.Tensor] = {}
        self._experts: dict[int, list[Any]] = {}  # id(model) -> its SplitExperts (expert parallelism)
        self._ep_local_parameters: set[int] = set()  # ids of the parameters only this ep group holds

    @classmethod
    def validate(cls, state: Any, precision_cls: Any, mode: str) -> None:
        config = state.parallelism_config
        if config.sp_enabled:
            raise ValueError(
                f"ParallelismConfig(sp_size={config.sp_size}) is sequence parallelism through DeepSpeed "
                "(ALST/Ulysses), which runs under DeepSpeed only: pass a DeepSpeedPlugin to the Accelerator "
                "(or launch with --use_deepspeed), or use cp_size for torch's context parallelism"
            )
        config.validate_world_size(state.num_processes)
        if config.cp_enabled and state.device.type == "cpu":
            raise NotImplementedError(
                f"context parallelism (cp_size={config.cp_size}) shards attention with torch's ring attention, "
                "which torch runs on CUDA only (it has no CPU sharding rule for scaled_dot_product_attention); "
                "on CPU set cp_size=1"
            )
        if getattr(state, "deepspeed_plugins", None):
            raise ValueError(
                "ParallelismConfig with tensor / context / sharded data parallelism runs on torch's mesh (FSDP2 "
                "and DTensor); it cannot be combined with DeepSpeed. Remove the DeepSpeed plugin or the sizes"
            )
        fsdp = getattr(state, "fsdp_plugin", None)
        if fsdp is not None and fsdp.fsdp_version != 2:
            raise ValueError(
                "ParallelismConfig shards data with FSDP2; the FSDP plugin says fsdp_version=1. Set "
                "fsdp_version=2 (or remove the FSDP plugin)"
            )
        if fsdp is not None:
            from accel_train.strategies.fsdp.fsdp2 import ND_REFUSED

            for field, why in ND_REFUSED.items():
                if getattr(fsdp, field, None):
                    raise ValueError(
                        f"FullyShardedDataParallelPlugin.{field} is not supported with ParallelismConfig "
                        f"(ND parallelism): {why}. Unset {field}, or use the FSDP strategy without tensor / "
                        "context parallelism"
                    )
            if setting_name(fsdp.state_dict_type) != "SHARDED_STATE_DICT":
                raise ValueError(
                    f"FullyShardedDataParallelPlugin.state_dict_type={setting_name(fsdp.state_dict_type)} is not supported with "
                    "ParallelismConfig (ND parallelism): its checkpoints are sharded torch.distributed.checkpoint "
                    "folders. Use SHARDED_STATE_DICT (the FSDP2 default); get a full state dict with "
                    "accelerator.get_state_dict(model)"
                )

    @classmethod
    def grad_scaler_factory(cls) -> Any:
        from accel_train.strategies.nd.grad_scaler import MeshGradScaler

        return MeshGradScaler

    # -- facts ----------------------------------------------------------------------------------------

    @property
    def device_mesh(self) -> Any:
        return self._mesh

    @property
    def is_composable_parallelism_enabled(self) -> bool:
        return True

    def _local_rank(self, dim: str) -> int:
        return self._mesh[dim].get_local_rank() if dim in self.config.active_mesh_dims else 0

    @property
    def parallel_dims(self) -> ParallelDims:
        config = self.config
        return ParallelDims(
            dp_replicate_size=config.dp_replicate_size,
            dp_shard_size=config.dp_shard_size,
            tp_size=config.tp_size,
            cp_size=config.cp_size,
            dp_replicate_rank=self._local_rank("dp_replicate"),
            dp_shard_rank=self._local_rank("dp_shard"),
            tp_rank=self._local_rank("tp"),
            cp_rank=self._local_rank("cp"),
            ep_size=config.ep_size,
            ep_rank=self._local_rank("ep"),
        )

    # -- set-up ---------------------------------------------------------------------------------------

    def setup(
        self,
        models: Sequence[torch.nn.Module],
        optimizers: Sequence[torch.optim.Optimizer],
        schedulers: Sequence[Any],
        device_placement: Sequence[bool],
        evaluation_mode: bool = False,
        data_loaders: Sequence[Any] = (),
    ) -> Any:
        # Parameters are replaced by DTensors: remember each one's name to rebind the optimizers.
        names = parameter_locations(models, canonical_name)
        prepared = super().setup(models, [], schedulers, device_placement, evaluation_mode, data_loaders)
        # names without the wrappers' prefixes (activation checkpointing, compile) on both sides
        new_params = [{canonical_name(n): p for n, p in m.named_parameters()} for m in prepared.models]
        # listed experts held by ep peers are gone from this process (and from its optimizers)
        elsewhere = {name for splits in self._experts.values() for split in splits for name in split.listed}
        for optimizer in optimizers:
            params = [p for group in optimizer.param_groups for p in group["params"]]
            if params and all(id(p) in names for p in params):
                rebind_optimizer_parameters(optimizer, names, new_params, dropped=elsewhere)
            else:
                self.setup_optimizer(optimizer, prepared.models)
        prepared.optimizers = list(optimizers)
        return prepared

    def setup_optimizer(self, optimizer: torch.optim.Optimizer, models: Sequence[torch.nn.Module]) -> Any:
        from torch.distributed.tensor import DTensor

        if all(isinstance(p, DTensor) for g in optimizer.param_groups for p in g["params"]):
            return optimizer  # built over the prepared model: already over the split parameters
        raise ValueError(
            "with tensor / sharded data parallelism, pass the optimizer to the same `prepare` call as its model "
            "(the model's parameters are replaced when it is split), or build it after preparing the model"
        )

    def setup_model(
        self, model: torch.nn.Module, device_placement: bool = True, evaluation_mode: bool = False
    ) -> torch.nn.Module:
        if device_placement:
            model = model.to(self.device)
        model = self.precision.convert_module(model)
        config = self.config
        if config.tp_enabled and not _has_dtensor_parameters(model):  # split by the user already: as it is
            from accel_train.strategies.nd.tensor_parallel import apply_plan, model_plan, resolve_plan

            explicit = getattr(config.tp_handler, "tp_plan", None)
            plan = resolve_plan(model, model_plan(model, explicit), config.tp_size)
            apply_plan(model, plan, self._mesh["tp"])
        from accel_bigmodel.experts import find_expert_modules

        found = find_expert_modules(model)
        has_experts = bool(found)
        _check_listed_experts_can_shard(found, config)
        experts: list[Any] = []
        if config.ep_enabled:
            from accel_train.strategies.nd.expert_parallel import apply_expert_parallel

            sharded = bool(config.expert_dp_dim_names)
            experts = apply_expert_parallel(
                model, self._mesh["ep"], self._expert_counts, experts_sharded=sharded, found=found
            )
            self._experts[id(model)] = experts
        fsdp_plugin = getattr(self.state, "fsdp_plugin", None)
        if fsdp_plugin is not None and fsdp_plugin.activation_checkpointing:
            fsdp2.apply_activation_checkpointing(model, fsdp_plugin)
        model = self.compile(model)
        if config.fsdp_dim_names:
            names = config.fsdp_dim_names
            fsdp2.shard_model(
                model,
                fsdp_plugin,
                mesh=self._sub_mesh(names),
                dtypes=self.precision.mixed_precision_dtypes(),
                offload=fsdp2.offload_wanted(fsdp_plugin, self.device),
                units=fsdp2.shard_units(model, fsdp_plugin, default_blocks=True),
                expert_units=[split.module for split in experts],
                expert_mesh=self._sub_mesh(config.expert_dp_dim_names),
            )
            reduce_unused = getattr(model, "set_reduce_scatter_unused_params", None)
            if has_experts and callable(reduce_unused):
                # an expert no token of this rank reached has no gradient here but may have one on a peer:
                # every rank reduces (zeros for it), or the reduce-scatters would not match
                reduce_unused(True)
        if experts:
            from accel_train.strategies.nd.expert_parallel import expert_local_parameters

            self._ep_local_parameters |= expert_local_parameters(experts)  # after FSDP2 replaced them
        self._models.append(model)
        return model

    def _sub_mesh(self, names: Sequence[str]) -> Any:
        """The sub-mesh of the dimensions ``names`` (``None`` for none)."""
        return self.config.sub_mesh(names)

    @property
    def expert_token_counts(self) -> dict[str, torch.Tensor]:
        """Per expert module, how many of this process's (token, choice) pairs each expert received in the
        module's latest forward (``[num_experts]`` int64); empty without expert parallelism."""
        return dict(self._expert_counts)

    # -- training step ----------------------------------------------------------------------------------

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
        """FSDP2's switch for gradient reduction, off inside the block (the FSDP strategy's helper)."""
        if not hasattr(model, "set_requires_gradient_sync"):
            return contextlib.nullcontext()
        return fsdp2.gradient_sync(model, False)

    def clip_grad_norm_(
        self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float, optimizers: Iterable[Any]
    ) -> torch.Tensor:
        """Total norm over every shard of every parameter (DTensors of different meshes alike), then clip."""
        from torch.distributed.tensor import DTensor

        parameters = [p for p in parameters if p.grad is not None]
        self.unscale_gradients(optimizers)
        norms: list[torch.Tensor] = []
        ep_local: list[torch.Tensor] = []
        for param in parameters:
            norm = torch.linalg.vector_norm(param.grad, norm_type)
            norm = norm.full_tensor() if isinstance(norm, DTensor) else norm
            (ep_local if id(param) in self._ep_local_parameters else norms).append(norm)
        if ep_local or self._ep_local_parameters:  # listed experts: every ep peer holds others
            norms.append(self._norm_over_ep(ep_local, norm_type))
        if not norms:
            return torch.tensor(0.0)
        total = torch.linalg.vector_norm(torch.stack(norms), norm_type)
        coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for param in parameters:
            grad = param.grad
            assert grad is not None  # kept above
            grad.mul_(coefficient.to(grad.device))
        return total

    def _norm_over_ep(self, norms: list[torch.Tensor], norm_type: float) -> torch.Tensor:
        """The ``norm_type`` norm of ``norms`` (this process's listed experts) and its ``ep`` peers' together."""
        import torch.distributed as dist

        local = (
            torch.linalg.vector_norm(torch.stack(norms), norm_type) if norms else torch.zeros((), device=self.device)
        )
        if norm_type == float("inf"):
            dist.all_reduce(local, op=dist.ReduceOp.MAX, group=self._mesh["ep"].get_group())
            return local
        power = local.double() ** norm_type
        dist.all_reduce(power, group=self._mesh["ep"].get_group())
        return (power ** (1.0 / norm_type)).to(local.dtype)

    @contextlib.contextmanager
    def context_parallel(self, buffers: Any = None, buffer_seq_dims: Any = None, no_restore_buffers: Any = None) -> Any:
        """Shard ``buffers`` along their sequence dimensions over ``cp`` (torch's context parallelism)."""
        if not self.config.cp_enabled:
            yield
            return
        from torch.distributed.tensor.experimental import context_parallel

        with context_parallel(
            self._mesh["cp"],
            buffers=buffers,
            buffer_seq_dims=buffer_seq_dims,
            no_restore_buffers=no_restore_buffers,
        ):
            yield

    # -- state ----------------------------------------------------------------------------------------

    def model_state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, Any]:
        """The full state dict, gathered on every rank (CPU tensors); call it on every rank."""
        inner = self.unwrap_model(model, keep_torch_compile=False)
        state = fsdp_state.full_model_state_dict(inner)
        splits = self._experts.get(id(inner), [])
        if any(split.listed for split in splits):
            from accel_train.strategies.nd.expert_parallel import gather_listed_experts

            state = gather_listed_experts(state, splits, self._mesh["ep"].get_group(), self.device)
        return state

    def _model_of(self, optimizer: Any) -> torch.nn.Module:
        inner = optimizer.optimizer if hasattr(optimizer, "optimizer") else optimizer
        params = {id(p) for group in inner.param_groups for p in group["params"]}
        for model in self._models:
            if any(id(p) in params for p in model.parameters()):
                return model
        raise ValueError("this optimizer holds parameters of no model prepared with the ND-parallel strategy")

    def optimizer_state_dict(self, optimizer: Any) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        inner = optimizer.optimizer if hasattr(optimizer, "optimizer") else optimizer
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_optimizer_state_dict(self._model_of(optimizer), inner, options=options)

    def accumulated_gradients(self, models: Sequence[torch.nn.Module]) -> dict[str, torch.Tensor]:
        sharded = fsdp2.unsharded_gradients([self.unwrap_model(m, keep_torch_compile=False) for m in models])
        return {**super().accumulated_gradients(models), **sharded}

    def restore_gradients(self, models: Sequence[torch.nn.Module], grads: dict[str, torch.Tensor] | None) -> None:
        targets = [self.unwrap_model(m, keep_torch_compile=False) for m in models]
        if self.config.fsdp_dim_names:
            fsdp2.restore_unsharded_gradients(targets, grads)
        else:
            super().restore_gradients(models, grads)

    def checkpoint_entries(self) -> dict[str, CheckpointEntry]:
        from accel_train import checkpointing as ckpt

        return {
            "model": CheckpointEntry(ckpt.SHARDED_MODEL_PATTERN, ckpt.sharded_model_dir),
            "optimizer": CheckpointEntry(ckpt.SHARDED_OPTIMIZER_PATTERN, ckpt.sharded_optimizer_dir),
        }

    def checkpoint_weights(self, model: torch.nn.Module) -> dict[str, Any] | None:
        return None  # every rank writes its shards

    def save_model_checkpoint(
        self, model: torch.nn.Module, weights: Any, folder: str, index: int, safe_serialization: bool, is_writer: bool
    ) -> str:
        name = self.checkpoint_entries()["model"].name(index)
        fsdp_state.save_sharded_model(
            self.unwrap_model(model, keep_torch_compile=False), os.path.join(folder, name), io=self.checkpoint_io
        )
        return name

    def load_model_checkpoint(
        self, model: torch.nn.Module, folder: str, entry: str, device: Any, strict: bool = True
    ) -> None:
        inner = self.unwrap_model(model, keep_torch_compile=False)
        held_elsewhere = {name for split in self._experts.get(id(inner), []) for name in split.listed}
        fsdp_state.load_sharded_model(
            inner, os.path.join(folder, entry), io=self.checkpoint_io, elsewhere=held_elsewhere
        )

    def save_optimizer_checkpoint(self, optimizer: Any, folder: str, index: int, is_writer: bool) -> str:
        name = self.checkpoint_entries()["optimizer"].name(index)
        inner = optimizer.optimizer if hasattr(optimizer, "optimizer") else optimizer
        fsdp_state.save_sharded_optimizer(
            self._model_of(optimizer), inner, os.path.join(folder, name), io=self.checkpoint_io
        )
        return name

    def load_optimizer_checkpoint(self, optimizer: Any, folder: str, index: int, map_location: Any) -> None:
        inner = optimizer.optimizer if hasattr(optimizer, "optimizer") else optimizer
        name = self.checkpoint_entries()["optimizer"].name(index)
        fsdp_state.load_sharded_optimizer(
            self._model_of(optimizer), inner, os.path.join(folder, name), io=self.checkpoint_io
        )


def _check_listed_experts_can_shard(found: Sequence[Any], config: Any) -> None:
    """Refuse, by name, FSDP2 over listed experts where torch cannot reduce unused parameters.

    Without expert parallelism an expert of a list that one rank's tokens miss has no gradient there
    while a peer has one; FSDP2 then needs ``set_reduce_scatter_unused_params`` (absent from older torch,
    e.g. 2.9), or the ranks' reduce-scatters differ and the run aborts in the middle of a step.
    """
    from torch.distributed.fsdp import FSDPModule

    listed = [expert.name for expert in found if expert.layout == "list"]
    if (
        listed
        and config.fsdp_dim_names
        and not config.ep_enabled
        and not hasattr(FSDPModule, "set_reduce_scatter_unused_params")
    ):
        raise NotImplementedError(
            f"sharding a mixture-of-experts model whose experts are a list ({listed[0]!r}) over dp_shard needs "
            f"FSDP2's set_reduce_scatter_unused_params, which torch {torch.__version__} lacks: an expert one "
            "rank's tokens miss would make the ranks' gradient reductions differ. Stack the experts' weights "
            "([num_experts, ...]), split them with ParallelismConfig(ep_size=...), or use a newer torch"
        )


def _has_dtensor_parameters(model: torch.nn.Module) -> bool:
    """True when some parameter is a DTensor: the user split the model (``parallelize_module``) already."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(param, DTensor) for param in model.parameters())
