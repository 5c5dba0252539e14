"""Fully Sharded Data Parallel, version 1 (``FullyShardedDataParallel``) and 2 (``fully_shard``).

The settings come from `FullyShardedDataParallelPlugin`. Preparing
a model shards it (its units from `accel_train.strategies.fsdp.wrap`); an optimizer built before, over the
model's original parameters, is rebound to the sharded ones (built after, it already holds them).
State dicts go through `accel_train.strategies.fsdp.state`: full ones gathered on every rank, sharded ones
as ``torch.distributed.checkpoint`` folders (``pytorch_model_fsdp_{i}/``, ``optimizer_{i}/``).

Runs on CPU with gloo as on GPUs. torch's CPU limits are handled here: FSDP1 gets
``device_id=torch.device("cpu")``; full state dicts are gathered without ``offload_to_cpu`` (FSDP1
crashes with it on CPU) and moved to the CPU afterwards; CPU offload (``cpu_offload`` /
``offload_params``) has nothing to do when the parameters already live on the CPU, so it is skipped
there with a warning.

One process: launched (``accel launch --use_fsdp --num_processes 1``, torchrun; ``LOCAL_RANK`` is set), the
model is sharded on a one-rank group (`accel_train.strategies.fsdp.group` starts it when the state did
not), as the documented system does: parameters in the policy's dtype, FSDP checkpoints. A plain
``python script.py`` leaves the model whole (the documented system ignores the plugin there); its
checkpoints keep the FSDP layout.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from accel_train import checkpointing as ckpt
from accel_train.optimizer import unwrap_optimizer
from accel_train.precisions.base import Precision
from accel_train.strategies.base import CheckpointEntry, ParallelDims, Strategy
from accel_train.strategies.fsdp import fsdp1, fsdp2
from accel_train.strategies.fsdp import group as fsdp_group
from accel_train.strategies.fsdp import state as fsdp_state
from accel_train.strategies.fsdp.plugin import setting_name
from accel_train.strategies.fsdp.wrap import (
    canonical_name,
    fsdp1_auto_wrap_policy,
    fsdp1_mixed_precision,
    ignored_modules_of,
    resolve_wrap_classes,
)
from accel_train.strategies.mesh import build_mesh
from accel_train.wrappers import is_compiled

__all__ = ["FSDPStrategy", "fsdp_grad_scaler"]

logger = logging.getLogger(__name__)


def fsdp_grad_scaler(device_type: str, **kwargs: Any) -> Any:
    """The fp16 gradient scaler of an FSDP run: torch's ``ShardedGradScaler`` (overflow checks over
    every rank's shards, so that all ranks skip the same steps)."""
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    return ShardedGradScaler(device_type, **kwargs)


def _is_fsdp1(model: Any) -> bool:
    return type(model).__name__ == "FullyShardedDataParallel"


def _is_fsdp2(model: Any) -> bool:
    return hasattr(model, "set_requires_gradient_sync") and hasattr(model, "reshard")


def _inner(model: Any) -> Any:
    return model._orig_mod if is_compiled(model) else model


def _has_meta(model: torch.nn.Module) -> bool:
    return any(t.device.type == "meta" for t in (*model.parameters(), *model.buffers()))


class FSDPStrategy(Strategy):
    """Shards parameters, gradients and optimizer state over the processes (FSDP 1 or 2)."""

    name = "fsdp"
    is_sharded = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._models: list[torch.nn.Module] = []
        # id(original parameter) -> (weak reference to it, the sharded parameter that replaces it)
        self._rebound: dict[int, tuple[Any, torch.nn.Parameter]] = {}
        # id(original parameter) -> FSDP1 model whose flat parameters replace it (use_orig_params=False)
        self._flattened: dict[int, tuple[Any, torch.nn.Module]] = {}
        self._mesh: Any = None

    # -- connector hooks --------------------------------------------------------------------------

    @classmethod
    def apply_settings(cls, state: Any, requested_mode: str, precision: Precision) -> None:
        """The precision's dtypes are known now: the plugin holds torch's mixed-precision policy, as the
        documented API does (one the user gave is kept)."""
        plugin = getattr(state, "fsdp_plugin", None)
        if plugin is None or plugin.mixed_precision_policy is not None:
            return
        dtypes = precision.mixed_precision_dtypes()
        if any(d is not None for d in dtypes):
            build = fsdp1_mixed_precision if int(plugin.fsdp_version) == 1 else fsdp2.fsdp2_mixed_precision_policy
            plugin.mixed_precision_policy = build(None, dtypes)

    @classmethod
    def grad_scaler_factory(cls) -> Any:
        return fsdp_grad_scaler

    @classmethod
    def validate(cls, state: Any, precision_cls: type[Precision], mode: str) -> None:
        plugin = getattr(state, "fsdp_plugin", None)
        if plugin is None:
            raise ValueError("the FSDP strategy needs a FullyShardedDataParallelPlugin (fsdp_plugin)")
        if mode == "fp8" and plugin.fsdp_version != 2:  # the table says fsdp takes fp8; FSDP1 does not
            raise ValueError(
                "mixed_precision='fp8' runs with FSDP2 (float8 layers sharded by fully_shard), not with FSDP1; "
                "set fsdp_version=2, or use 'bf16' / 'fp16' with FSDP1"
            )

    # -- facts ------------------------------------------------------------------------------------

    @property
    def plugin(self) -> Any:
        return self.state.fsdp_plugin

    @property
    def fsdp_version(self) -> int:
        return int(self.plugin.fsdp_version)

    def _sharding(self) -> str:
        strategy = self.plugin.sharding_strategy
        if self.fsdp_version == 2 or strategy is None:
            return "FULL_SHARD" if self.fsdp_version == 1 or self.plugin.reshard_after_forward else "SHARD_GRAD_OP"
        return strategy if isinstance(strategy, str) else strategy.name.lstrip("_")

    @property
    def parallel_dims(self) -> ParallelDims:
        world, rank = self.state.num_processes, self.state.process_index
        sharding = self._sharding()
        if sharding == "NO_SHARD":
            return ParallelDims(dp_replicate_size=world, dp_replicate_rank=rank)
        if sharding.startswith("HYBRID"):
            local = int(getattr(self.state, "local_num_processes", world) or world)
            return ParallelDims(
                dp_replicate_size=world // local,
                dp_shard_size=local,
                dp_replicate_rank=rank // local,
                dp_shard_rank=rank % local,
            )
        return ParallelDims(dp_shard_size=world, dp_shard_rank=rank)

    @property
    def device_mesh(self) -> Any:
        return self._mesh

    def _distributed(self) -> bool:
        import torch.distributed as dist

        return self.state.num_processes > 1 and dist.is_available() and dist.is_initialized()

    def _shards(self) -> bool:
        """Whether prepared models are sharded: several processes, or one that a launcher started (its
        one-rank group is started here when the state did not start one)."""
        if self._distributed():
            return True
        if self.state.num_processes != 1 or not fsdp_group.launched():
            return False
        fsdp_group.start_single_process_group(self.device)
        return True

    # -- set-up -----------------------------------------------------------------------------------

    def materialises_meta_weights(self, evaluation_mode: bool = False) -> bool:
        """Sharded set-up gives ``meta`` weights values: ``param_init_fn``, or rank 0's weights broadcast
        (``cpu_ram_efficient_loading``); a model prepared whole is placed like any other.

        Args:
            evaluation_mode: the model is prepared for inference only (never sharded).
        """
        return not evaluation_mode and self._shards()

    def setup_model(
        self, model: torch.nn.Module, device_placement: bool = True, evaluation_mode: bool = False
    ) -> torch.nn.Module:
        if evaluation_mode or not self._shards():
            prepared = super().setup_model(model, device_placement, evaluation_mode)
            if not evaluation_mode:
                self._models.append(_inner(prepared))
            return prepared
        before = {id(p): (weakref.ref(p), name) for name, p in model.named_parameters(remove_duplicate=True)}
        model = self.precision.convert_module(model)
        wrapped = self._shard_v1(model) if self.fsdp_version == 1 else self._shard_v2(model, device_placement)
        self._remember_parameters(before, wrapped)
        self._models.append(wrapped)
        return self.compile(wrapped)

    def _remember_parameters(self, before: dict[int, tuple[Any, str]], wrapped: torch.nn.Module) -> None:
        if _is_fsdp1(wrapped) and not self.plugin.use_orig_params:
            for key, (ref, _) in before.items():
                self._flattened[key] = (ref, wrapped)
            return
        after = {canonical_name(name): p for name, p in wrapped.named_parameters()}
        for key, (ref, name) in before.items():
            new = after.get(name)
            if new is not None:
                self._rebound[key] = (ref, new)

    def _offload(self) -> bool:
        return fsdp2.offload_wanted(self.plugin, self.device)

    def _ac_classes(self, model: torch.nn.Module) -> tuple[type, ...]:
        return tuple(resolve_wrap_classes(model, self.plugin.transformer_cls_names_to_wrap))

    def _apply_ac(self, model: torch.nn.Module, classes: tuple[type, ...]) -> None:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            CheckpointImpl,
            apply_activation_checkpointing,
            checkpoint_wrapper,
        )

        wrapper = (
            (lambda m: checkpoint_wrapper(m, offload_to_cpu=True))
            if self.plugin.activation_checkpointing_offload
            else (lambda m: checkpoint_wrapper(m, checkpoint_impl=CheckpointImpl.NO_REENTRANT))
        )
        apply_activation_checkpointing(model, checkpoint_wrapper_fn=wrapper, check_fn=lambda m: isinstance(m, classes))

    def _hybrid_mesh(self) -> Any:
        dims = self.parallel_dims
        return build_mesh(
            self.device.type, [("dp_replicate", dims.dp_replicate_size), ("dp_shard", dims.dp_shard_size)]
        )

    def _shard_v1(self, model: torch.nn.Module) -> torch.nn.Module:
        from torch.distributed.fsdp import BackwardPrefetch, CPUOffload, ShardingStrategy
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        plugin = self.plugin
        device = self.device
        ac_classes = self._ac_classes(model) if plugin.activation_checkpointing else ()
        strategy = plugin.sharding_strategy
        if isinstance(strategy, str):
            # torch names HYBRID_SHARD_ZERO2 with a leading underscore.
            strategy = ShardingStrategy[strategy if strategy in ShardingStrategy.__members__ else f"_{strategy}"]
        prefetch = plugin.backward_prefetch
        if isinstance(prefetch, str):
            prefetch = None if prefetch == "NO_PREFETCH" else BackwardPrefetch[prefetch]
        offload = plugin.cpu_offload
        offload = offload if isinstance(offload, CPUOffload) else CPUOffload(offload_params=self._offload())
        if offload.offload_params and device.type == "cpu":
            offload = CPUOffload(offload_params=self._offload())
        sync = bool(plugin.sync_module_states)
        if sync and device.type == "cpu":
            # FSDP1 refuses sync_module_states for CPU tensors: rank 0's weights are broadcast here instead.
            _broadcast_from_rank0(model, device)
            sync = False
        param_init_fn = plugin.param_init_fn
        if param_init_fn is None and _has_meta(model):

            def param_init_fn(module: torch.nn.Module) -> None:
                module.to_empty(device=device, recurse=False)

        dtypes = self.precision.mixed_precision_dtypes()
        kwargs: dict[str, Any] = {
            "sharding_strategy": strategy,
            "cpu_offload": offload,
            "auto_wrap_policy": fsdp1_auto_wrap_policy(model, plugin),
            "backward_prefetch": prefetch,
            "mixed_precision": fsdp1_mixed_precision(plugin.mixed_precision_policy, dtypes),
            "ignored_modules": ignored_modules_of(model, plugin.ignored_modules) or None,
            "param_init_fn": param_init_fn,
            "device_id": device if device.type == "cpu" else (device.index if device.index is not None else device),
            "sync_module_states": sync,
            "forward_prefetch": bool(plugin.forward_prefetch),
            "limit_all_gathers": bool(plugin.limit_all_gathers),
            "use_orig_params": bool(plugin.use_orig_params),
        }
        if strategy in (ShardingStrategy.HYBRID_SHARD, ShardingStrategy._HYBRID_SHARD_ZERO2):
            self._mesh = self._hybrid_mesh()
            kwargs["device_mesh"] = self._mesh
        wrapped = FSDP(model, **kwargs)
        if dtypes[0] is not None:  # mixed precision: fp32 weights, as FSDP2
            fsdp1.upcast_flat_parameters(wrapped)
        if self._mesh is None:
            self._mesh = build_mesh(device.type, [("dp_shard", self.state.num_processes)])
        if ac_classes:
            self._apply_ac(wrapped, ac_classes)
        return wrapped

    def _shard_v2(self, model: torch.nn.Module, device_placement: bool) -> torch.nn.Module:
        import torch.distributed as dist

        plugin = self.plugin
        device = self.device
        if self._mesh is None:
            self._mesh = build_mesh(device.type, [("dp_shard", self.state.num_processes)])
        if plugin.activation_checkpointing:
            fsdp2.apply_activation_checkpointing(model, plugin)
        units = fsdp2.shard_units(model, plugin)
        ram_efficient = bool(plugin.cpu_ram_efficient_loading)
        rank0 = dist.get_rank() == 0
        full_state: dict[str, torch.Tensor] = {}
        kept_buffers: dict[str, torch.Tensor] = {}
        if ram_efficient:
            if rank0:
                full_state = {k: v.to(device) for k, v in model.state_dict().items()}
                kept_buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
            model.to("meta")
        elif plugin.sync_module_states:
            _broadcast_from_rank0(model, device)
        elif device_placement and not _has_meta(model):
            model.to(device)
        fsdp2.shard_model(
            model,
            plugin,
            mesh=self._mesh,
            dtypes=self.precision.mixed_precision_dtypes(),
            offload=self._offload(),
            units=units,
        )
        if ram_efficient:
            model.to_empty(device=device)
            fsdp_state.load_full_model_state_dict(model, full_state, strict=False, broadcast_from_rank0=True)
            for name, buffer in model.named_buffers():
                if rank0 and name in kept_buffers:
                    buffer.data.copy_(kept_buffers[name])
                dist.broadcast(buffer.data, src=0)
        return model

    def setup_optimizer(
        self, optimizer: torch.optim.Optimizer, models: Sequence[torch.nn.Module]
    ) -> torch.optim.Optimizer:
        """Replace the original parameters in the optimizer's groups by the sharded ones."""
        flat_owner = None
        for group in optimizer.param_groups:
            params = []
            for param in group["params"]:
                entry = self._rebound.get(id(param))
                if entry is not None and entry[0]() is param:
                    params.append(entry[1])
                    continue
                flat = self._flattened.get(id(param))
                if flat is not None and flat[0]() is param:
                    flat_owner = flat[1]
                params.append(param)
            group["params"] = params
        if flat_owner is not None:
            if len(optimizer.param_groups) > 1:
                raise ValueError(
                    "an optimizer with several parameter groups built before prepare needs use_orig_params=True "
                    "under FSDP1 (with use_orig_params=False each unit's parameters are one flat tensor); set "
                    "fsdp_use_orig_params: true or build the optimizer after prepare"
                )
            optimizer.param_groups[0]["params"] = list(flat_owner.parameters())
        stale = [p for p in optimizer.state if not any(p is q for g in optimizer.param_groups for q in g["params"])]
        if stale:
            raise ValueError(
                "the optimizer already holds state for parameters that FSDP replaced by shards; build the "
                "optimizer (or load its state) after prepare"
            )
        return optimizer

    # -- training step ----------------------------------------------------------------------------

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
        inner = _inner(model)
        if _is_fsdp1(inner):
            return inner.no_sync()  # type: ignore[no-any-return]
        if _is_fsdp2(inner):
            return _gradient_sync(inner, False)
        return contextlib.nullcontext()

    def force_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
        inner = _inner(model)
        if _is_fsdp1(inner):
            return _fsdp1_sync(inner)
        if _is_fsdp2(inner):
            return _gradient_sync(inner, True)
        return contextlib.nullcontext()

    def clip_grad_norm_(
        self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float, optimizers: Iterable[Any]
    ) -> torch.Tensor:
        """Clip by the norm over every rank's shards; returns that norm (a plain tensor on every rank)."""
        parameters = list(parameters)
        self.unscale_gradients(optimizers)
        ids = {id(p) for p in parameters}
        for model in self._models:
            if _is_fsdp1(model) and ids & {id(p) for p in model.parameters()}:
                return model.clip_grad_norm_(max_norm, norm_type)  # type: ignore[no-any-return, operator]
        return _clip_mixed(parameters, max_norm, norm_type)

    # -- state ------------------------------------------------------------------------------------

    def model_state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, Any]:
        """The full state dict, gathered on every rank (call it on every rank)."""
        return fsdp_state.full_model_state_dict(_inner(model))

    def _model_of(self, optimizer: Any) -> torch.nn.Module:
        inner = unwrap_optimizer(optimizer)
        ids = {id(p) for group in inner.param_groups for p in group["params"]}
        owners = [m for m in self._models if ids & {id(p) for p in m.parameters()}]
        if not owners:
            raise ValueError("this optimizer's parameters belong to no model prepared with FSDP; prepare the model")
        return owners[0] if len(owners) == 1 else torch.nn.ModuleList(owners)

    def optimizer_state_dict(self, optimizer: Any) -> dict[str, Any]:
        return fsdp_state.full_optimizer_state_dict(self._model_of(optimizer), unwrap_optimizer(optimizer))

    def load_optimizer_state_dict(self, optimizer: Any, state_dict: dict[str, Any]) -> None:
        fsdp_state.load_full_optimizer_state_dict(self._model_of(optimizer), unwrap_optimizer(optimizer), state_dict)

    def accumulated_gradients(self, models: Sequence[torch.nn.Module]) -> dict[str, torch.Tensor]:
        if any(_is_fsdp2(m) for m in self._models):
            return fsdp2.unsharded_gradients([_inner(m) for m in models])
        return super().accumulated_gradients(models)

    def restore_gradients(self, models: Sequence[torch.nn.Module], grads: dict[str, torch.Tensor] | None) -> None:
        if any(_is_fsdp2(m) for m in self._models):
            fsdp2.restore_unsharded_gradients([_inner(m) for m in models], grads)
            return
        super().restore_gradients(models, grads)

    # -- checkpoints ------------------------------------------------------------------------------

    @property
    def _sharded_checkpoints(self) -> bool:
        return setting_name(self.plugin.state_dict_type) != "FULL_STATE_DICT"

    def checkpoint_entries(self) -> dict[str, CheckpointEntry]:

        sharded = self._sharded_checkpoints
        return {
            "model": CheckpointEntry(
                # the reference release's full file (pytorch_model_fsdp.bin) is read too
                f"{ckpt.SHARDED_MODEL_PATTERN}|{ckpt.MODEL_FILE_PATTERN}|{ckpt.FSDP_FULL_MODEL_PATTERN}",
                ckpt.sharded_model_dir if sharded else (lambda i: ckpt.model_file(i, True)),
            ),
            "optimizer": CheckpointEntry(
                f"{ckpt.SHARDED_OPTIMIZER_PATTERN}|{ckpt.OPTIMIZER_FILE_PATTERN}",
                ckpt.sharded_optimizer_dir if sharded else ckpt.optimizer_file,
            ),
        }

    def checkpoint_settings(self) -> dict[str, Any]:
        """FSDP's version, sharding strategy and state-dict type (what decides how the checkpoint reshards)."""
        return {
            "fsdp_version": self.fsdp_version,
            "sharding_strategy": self._sharding(),
            "state_dict_type": setting_name(self.plugin.state_dict_type),
        }

    def checkpoint_weights(self, model: torch.nn.Module) -> dict[str, Any] | None:
        from accel_state.state import GradientState

        if any(_is_fsdp1(m) for m in self._models) and not GradientState().sync_gradients:
            # FSDP1 keeps the gradients of skipped syncs inside its flat parameters' buffers: they cannot be
            # written and put back per parameter, so a resume from here would not be exact (FSDP2 can).
            raise ValueError(
                "save_state between two optimizer steps of gradient accumulation is not supported with FSDP1 "
                "(the gradients gathered so far live in FSDP's unsharded buffers); call it after the "
                "optimizer step of a sync step (when accelerator.sync_gradients is True), or use fsdp_version=2"
            )
        return None if self._sharded_checkpoints else self.model_state_dict(model)

    def async_save_refusal(self) -> str | None:
        if self.fsdp_version == 2 and self._sharded_checkpoints:
            return None
        return (
            "FSDP saves asynchronously with fsdp_version=2 and state_dict_type='SHARDED_STATE_DICT' only "
            f"(this run: fsdp_version={self.fsdp_version}, {setting_name(self.plugin.state_dict_type)})"
        )

    def staged_shards(self, model: torch.nn.Module) -> dict[str, Any] | None:
        if not self._sharded_checkpoints:
            return None
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return get_model_state_dict(_inner(model))

    def staged_optimizer_state(self, optimizer: Any) -> Any:
        if not self._sharded_checkpoints:
            return super().staged_optimizer_state(optimizer)
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        return get_optimizer_state_dict(self._model_of(optimizer), unwrap_optimizer(optimizer))

    def save_model_checkpoint(
        self,
        model: torch.nn.Module,
        weights: dict[str, Any] | None,
        folder: str,
        index: int,
        safe_serialization: bool,
        is_writer: bool,
    ) -> str | None:
        import os

        if not self._sharded_checkpoints:
            return super().save_model_checkpoint(model, weights, folder, index, safe_serialization, is_writer)
        name = ckpt.sharded_model_dir(index)
        if weights is not None:  # an asynchronous save's copy of this process's shards (staged_shards)
            self.checkpoint_io.save_sharded({fsdp_state.MODEL_KEY: weights}, os.path.join(folder, name))
            return name
        local = setting_name(self.plugin.state_dict_type) == "LOCAL_STATE_DICT"
        fsdp_state.save_sharded_model(_inner(model), os.path.join(folder, name), local=local, io=self.checkpoint_io)
        return name

    def load_model_checkpoint(
        self, model: torch.nn.Module, folder: str, entry: str, device: Any, strict: bool = True
    ) -> None:
        import os

        path = os.path.join(folder, entry)
        if os.path.isdir(path):
            local = setting_name(self.plugin.state_dict_type) == "LOCAL_STATE_DICT"
            fsdp_state.load_sharded_model(_inner(model), path, strict=strict, local=local, io=self.checkpoint_io)
            return
        weights = self.checkpoint_io.load_weights(path, "cpu")
        fsdp_state.load_full_model_state_dict(_inner(model), weights, strict=strict, source=path)

    def save_optimizer_checkpoint(self, optimizer: Any, folder: str, index: int, is_writer: bool) -> str | None:
        import os

        if not self._sharded_checkpoints:
            return super().save_optimizer_checkpoint(optimizer, folder, index, is_writer)
        name = ckpt.sharded_optimizer_dir(index)
        if getattr(optimizer, "staged", False):  # an asynchronous save's copy (staged_optimizer_state)
            state = {fsdp_state.OPTIMIZER_KEY: optimizer.state_dict()}
            self.checkpoint_io.save_sharded(state, os.path.join(folder, name))
            return name
        fsdp_state.save_sharded_optimizer(
            self._model_of(optimizer), unwrap_optimizer(optimizer), os.path.join(folder, name), io=self.checkpoint_io
        )
        return name

    def load_optimizer_checkpoint(self, optimizer: Any, folder: str, index: int, map_location: Any) -> None:
        import os

        path = os.path.join(folder, ckpt.sharded_optimizer_dir(index))
        if os.path.isdir(path):
            fsdp_state.load_sharded_optimizer(
                self._model_of(optimizer), unwrap_optimizer(optimizer), path, io=self.checkpoint_io
            )
            return
        super().load_optimizer_checkpoint(optimizer, folder, index, "cpu")


def _broadcast_from_rank0(model: torch.nn.Module, device: torch.device) -> None:
    """Give every rank rank 0's parameters and buffers (ranks holding meta tensors get storage first)."""
    import torch.distributed as dist

    if _has_meta(model):
        model.to_empty(device=device)
    else:
        model.to(device)
    with torch.no_grad():
        for tensor in (*model.parameters(), *model.buffers()):
            dist.broadcast(tensor.data, src=0)


def _clip_mixed(parameters: list[torch.Tensor], max_norm: float, norm_type: float) -> torch.Tensor:
    """Clip FSDP2 shards (DTensors) and parameters FSDP leaves alone (ignored modules) by one norm."""
    sharded = [p for p in parameters if p.grad is not None and hasattr(p.grad, "full_tensor")]
    plain = [p for p in parameters if p.grad is not None and not hasattr(p.grad, "full_tensor")]
    if not sharded:
        return torch.nn.utils.clip_grad_norm_(plain, max_norm, norm_type=norm_type)
    sharded_grads: list[Any] = [p.grad for p in sharded]
    plain_grads: list[Any] = [p.grad for p in plain]
    norms = [torch.nn.utils.get_total_norm(sharded_grads, norm_type).full_tensor()]  # type: ignore[attr-defined]
    if plain:
        norms.append(torch.nn.utils.get_total_norm(plain_grads, norm_type).to(norms[0].device))
    stacked = torch.stack([n.float() for n in norms])
    total = stacked.max() if norm_type == float("inf") else stacked.pow(norm_type).sum().pow(1.0 / norm_type)
    for group in (sharded, plain):
        if group:
            torch.nn.utils.clip_grads_with_norm_(group, max_norm, total)
    return total


_gradient_sync = fsdp2.gradient_sync


@contextlib.contextmanager
def _fsdp1_sync(model: Any) -> Iterator[None]:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    modules = FSDP.fsdp_modules(model)
    previous = [m._sync_gradients for m in modules]
    for m in modules:
        m._sync_gradients = True  # type: ignore[assignment]
    try:
        yield
    finally:
        for m, value in zip(modules, previous):
            m._sync_gradients = value
