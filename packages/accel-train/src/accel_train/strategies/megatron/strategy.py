"""The Megatron-LM strategy, on megatron-core's public API (no ``megatron.training`` / ``megatron.legacy``).

- When the Accelerator is built: megatron-core's ``parallel_state`` is initialised over the existing
  process group (tensor x pipeline x data groups from the plugin's degrees). This works over gloo on
  CPU, so the parallel layout is known (and data loaders shard over the data-parallel group) before
  any model exists.
- ``prepare``: needs CUDA (megatron-core's layers and RNG tracker call it directly; the first call on
  CPU is ``tensor_parallel.model_parallel_cuda_manual_seed``). It builds megatron-core's model (a
  ``GPTModel`` / ``BertModel`` / ``T5Model`` of the sizes of the given transformers model's config, or
  the plugin's ``custom_model_provider_function``), wraps it in megatron-core's
  ``DistributedDataParallel``, and builds megatron-core's optimizer (from the torch optimizer's
  hyper-parameters) and ``OptimizerParamScheduler`` (from the ``MegatronLMDummyScheduler``).
- Checkpoints: megatron-core distributed checkpointing of the model and optimizer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from accel_state.install_hints import install_hint
from accel_train.checkpoint import megatron_io
from accel_train.parallel_plugins import BackendNotAvailableError
from accel_train.precisions.engine import EnginePrecision, no_scaler
from accel_train.strategies.base import CheckpointEntry, ParallelDims, Prepared, Strategy
from accel_train.strategies.megatron import config as translate
from accel_train.strategies.megatron.engine import (
    MegatronEngine,
    MegatronOptimizerWrapper,
    MegatronSchedulerWrapper,
)

__all__ = ["MegatronCUDARequiredError", "MegatronLMStrategy", "megatron_core_available"]

MODEL_ENTRY = "megatron_model"
OPTIMIZER_ENTRY = "megatron_optimizer"


class MegatronCUDARequiredError(BackendNotAvailableError):
    """megatron-core's model, optimizer and schedules run on CUDA only."""


class MegatronPrecision(EnginePrecision):
    """The precision under Megatron-LM: megatron-core casts the model and scales the loss (its configs'
    ``bf16`` / ``fp16``); ``mode`` reports the dtype."""


def megatron_core_available() -> bool:
    """True when megatron-core can be imported (checked without importing it)."""
    import importlib.util

    return importlib.util.find_spec("megatron") is not None and importlib.util.find_spec("megatron.core") is not None


class MegatronLMStrategy(Strategy):
    """Tensor, pipeline and data parallelism by megatron-core."""

    name = "megatron_lm"
    is_sharded = True
    backend_steps_optimizer = True

    def __init__(self, state: Any, precision: Any, checkpoint_io: Any = None, handlers: Any = None) -> None:
        super().__init__(state, precision, checkpoint_io, handlers)
        self.plugin = state.megatron_lm_plugin
        self.mode = str(getattr(precision, "mode", "no"))
        self._engines: list[MegatronEngine] = []
        # id(megatron-core optimizer) -> (that optimizer, the user's torch optimizer, its engine)
        self._optimizers: dict[int, tuple[Any, Any, MegatronEngine]] = {}
        self._wrappers: dict[int, MegatronOptimizerWrapper] = {}
        self._schedulers: set[int] = set()
        self._initialize_parallel_state()

    @classmethod
    def validate(cls, state: Any, precision_cls: Any, mode: str) -> None:
        """Refuse what cannot run, by name.

        A missing megatron-core or CUDA is refused at ``prepare`` (`require_backend()`), so that the
        configuration is still checked and data loaders prepared on a machine without them.

        Raises:
            ValueError: tp x pp does not divide the number of processes; fp8 (not wired to megatron-core).
        """
        plugin = state.megatron_lm_plugin
        model_parallel = (plugin.tp_degree or 1) * (plugin.pp_degree or 1)
        if state.num_processes % model_parallel:
            raise ValueError(
                f"tp_degree {plugin.tp_degree} x pp_degree {plugin.pp_degree} = {model_parallel} does not divide "
                f"the {state.num_processes} processes; choose degrees whose product divides it"
            )
        if mode == "fp8":
            raise ValueError("mixed_precision='fp8' is not wired to megatron-core here; use 'bf16', 'fp16' or 'no'")

    @classmethod
    def precision_for(cls, precision_cls: Any, mode: str) -> Any:
        """megatron-core runs its own mixed precision (``bf16`` / ``fp16`` in its configs): no autocast here."""
        return MegatronPrecision

    @classmethod
    def grad_scaler_factory(cls) -> Any:
        return no_scaler

    def _initialize_parallel_state(self) -> None:
        import torch.distributed as dist

        if not dist.is_initialized() or not megatron_core_available():
            return
        from megatron.core import parallel_state as ps

        kwargs = translate.parallel_state_kwargs(self.plugin, self._num_layers_hint())
        if ps.model_parallel_is_initialized():
            current = (ps.get_tensor_model_parallel_world_size(), ps.get_pipeline_model_parallel_world_size())
            if current == (kwargs["tensor_model_parallel_size"], kwargs["pipeline_model_parallel_size"]):
                return
            ps.destroy_model_parallel()  # a new Accelerator with other degrees (tests, notebooks)
        ps.initialize_model_parallel(**kwargs)

    def _ensure_process_group(self) -> None:
        """megatron-core needs a process group even on one GPU: start a one-process one if none runs."""
        import torch.distributed as dist

        if not dist.is_initialized():
            from accel_state.testing import free_port

            dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", world_size=1, rank=0)
        self._initialize_parallel_state()

    def _num_layers_hint(self) -> int | None:
        return (self.plugin.other_megatron_args or {}).get("num_layers")

    # -- facts ----------------------------------------------------------------------------------------

    @property
    def parallel_dims(self) -> ParallelDims:
        import torch.distributed as dist

        if not dist.is_initialized() or not megatron_core_available():
            return super().parallel_dims
        from megatron.core import parallel_state as ps

        dims = ParallelDims(
            dp_replicate_size=ps.get_data_parallel_world_size(),
            dp_replicate_rank=ps.get_data_parallel_rank(),
            tp_size=ps.get_tensor_model_parallel_world_size(),
            tp_rank=ps.get_tensor_model_parallel_rank(),
        )
        names = {f.name for f in dataclasses.fields(dims)}
        if "pp_size" in names:
            dims = dataclasses.replace(
                dims,
                pp_size=ps.get_pipeline_model_parallel_world_size(),
                pp_rank=ps.get_pipeline_model_parallel_rank(),
            )
        return dims

    # -- set-up ---------------------------------------------------------------------------------------

    @staticmethod
    def require_backend() -> None:
        """Raise unless megatron-core is installed and CUDA is available.

        Raises:
            BackendNotAvailableError: megatron-core is missing (names the extra that installs it).
            MegatronCUDARequiredError: no CUDA.
        """
        if not megatron_core_available():
            raise BackendNotAvailableError(
                f"Megatron-LM training needs megatron-core 0.16: {install_hint('accel-train', 'megatron')}"
            )
        if not torch.cuda.is_available():
            raise MegatronCUDARequiredError(
                "Megatron-LM needs CUDA: megatron-core's layers, RNG tracker and schedules call torch.cuda directly "
                "(on CPU the first failure is tensor_parallel.model_parallel_cuda_manual_seed). The plugin, the "
                "parallel groups and the data loaders are set up; building the model needs a GPU"
            )

    def materialises_meta_weights(self, evaluation_mode: bool = False) -> bool:
        """Megatron-LM builds its own model from the given one's config: that model's weights need no values.

        Args:
            evaluation_mode: the model is prepared for inference only.
        """
        return True

    def setup(
        self,
        models: Sequence[torch.nn.Module],
        optimizers: Sequence[torch.optim.Optimizer],
        schedulers: Sequence[Any],
        device_placement: Sequence[bool],
        evaluation_mode: bool = False,
        data_loaders: Sequence[Any] = (),
    ) -> Prepared:
        if not (models or optimizers or schedulers):
            return Prepared([], [], [])
        self.require_backend()
        self._ensure_process_group()
        if len(models) > 1:
            raise ValueError("Megatron-LM prepares one model per Accelerator")
        if optimizers and not (models or self._engines):
            raise ValueError("under Megatron-LM the optimizer is built with its model: prepare them together")
        self._batch_sizes(data_loaders)
        engines = [self._build_engine(model) for model in models]
        engine = engines[0] if engines else self._engines[-1] if self._engines else None
        built = [self._build_optimizer(optimizer, engine) for optimizer in optimizers]
        return Prepared(list(engines), built, [self._build_scheduler(s) for s in schedulers])

    def _batch_sizes(self, data_loaders: Sequence[Any]) -> None:
        """Micro-batch and global batch sizes from the prepared loaders' per-process batch size."""
        sizes: list[int] = [int(size) for loader in data_loaders if (size := getattr(loader, "batch_size", None))]
        if sizes and self.plugin.micro_batch_size is None:
            per_process = min(sizes) if self.plugin.is_train_batch_min else max(sizes)
            micro = max(per_process // (self.plugin.num_micro_batches or 1), 1)
            self.plugin.set_batch_sizes(micro, self.parallel_dims.data_parallel_size)

    def _train_step(self, family: str) -> Any:
        from accel_train.strategies.megatron.train_step import BertTrainStep, GPTTrainStep, T5TrainStep

        plugin = self.plugin
        if plugin.custom_train_step_class is not None:
            return plugin.custom_train_step_class(plugin, **(plugin.custom_train_step_kwargs or {}))
        return {"gpt": GPTTrainStep, "bert": BertTrainStep, "t5": T5TrainStep}[family](plugin)

    def _build_engine(self, model: torch.nn.Module) -> MegatronEngine:
        from megatron.core import parallel_state
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed
        from megatron.core.transformer import TransformerConfig

        plugin = self.plugin
        other = plugin.other_megatron_args or {}
        facts = translate.model_facts(getattr(model, "config", None), other)
        routed = self._routed()
        config = TransformerConfig(
            **{**translate.transformer_config_kwargs(plugin, facts, self.mode), **routed["transformer"]}
        )
        model_parallel_cuda_manual_seed(int(other.get("seed", 1234)))
        chunks = []
        vp = parallel_state.get_virtual_pipeline_model_parallel_world_size() or 1
        for stage in range(vp):
            pre = (
                parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=stage)
                if vp > 1
                else (parallel_state.is_pipeline_first_stage())
            )
            post = (
                parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=stage)
                if vp > 1
                else (parallel_state.is_pipeline_last_stage())
            )
            if plugin.custom_model_provider_function is not None:
                chunk = plugin.custom_model_provider_function(pre_process=pre, post_process=post)
            else:
                chunk = _core_model(facts, config, other, pre, post, stage if vp > 1 else None)
            chunk.cuda(torch.cuda.current_device())
            ddp_config = DistributedDataParallelConfig(**{**translate.ddp_config_kwargs(plugin), **routed["ddp"]})
            chunks.append(DistributedDataParallel(config=config, ddp_config=ddp_config, module=chunk))
        seq_length = plugin.seq_length or plugin.decoder_seq_length or facts.max_position_embeddings
        engine = MegatronEngine(chunks, self._train_step(facts.family), plugin, seq_length)
        self._engines.append(engine)
        return engine

    def _routed(self) -> dict[str, dict[str, Any]]:
        from megatron.core.distributed import DistributedDataParallelConfig
        from megatron.core.optimizer import OptimizerConfig
        from megatron.core.transformer import TransformerConfig

        fields = {
            "transformer": [f.name for f in dataclasses.fields(TransformerConfig)],
            "optimizer": [f.name for f in dataclasses.fields(OptimizerConfig)],
            "ddp": [f.name for f in dataclasses.fields(DistributedDataParallelConfig)],
        }
        return translate.route_other_args(self.plugin.other_megatron_args or {}, fields)

    def _build_optimizer(self, optimizer: Any, engine: MegatronEngine | None) -> Any:
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        if engine is None:
            raise ValueError("under Megatron-LM the optimizer is built with its model: prepare them together")
        kwargs = {**translate.optimizer_config_kwargs(self.plugin, optimizer, self.mode), **self._routed()["optimizer"]}
        built = get_megatron_optimizer(OptimizerConfig(**kwargs), list(engine.module))
        self._optimizers[id(built)] = (built, optimizer, engine)
        return built

    def _build_scheduler(self, scheduler: Any) -> Any:
        from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

        from accel_train.strategies.megatron.utils import MegatronLMDummyScheduler

        if not isinstance(scheduler, MegatronLMDummyScheduler):
            raise TypeError(
                "Megatron-LM builds its own learning-rate scheduler: prepare a MegatronLMDummyScheduler("
                f"optimizer, total_num_steps=..., warmup_num_steps=...), not {type(scheduler).__name__}"
            )
        target = scheduler.optimizer
        entry = next((e for e in self._optimizers.values() if target is e[1] or target is e[0]), None)
        if entry is None:
            wrapper = next((w for w in self._wrappers.values() if w is target), None)
            entry = self._optimizers.get(id(wrapper.optimizer)) if wrapper is not None else None
        if entry is None:
            raise ValueError("the MegatronLMDummyScheduler's optimizer was not prepared with the model")
        megatron_optimizer, torch_optimizer, _ = entry
        defaults = dict(getattr(torch_optimizer, "defaults", {}))
        kwargs = translate.scheduler_kwargs(
            self.plugin, scheduler, float(defaults.get("lr", 1e-3)), float(defaults.get("weight_decay", 0.0))
        )
        result = OptimizerParamScheduler(megatron_optimizer, **kwargs)
        self._schedulers.add(id(result))
        return result

    def wrap_optimizer(self, optimizer: Any, device_placement: bool) -> Any:
        if id(optimizer) in self._optimizers:
            wrapped = MegatronOptimizerWrapper(optimizer, self._optimizers[id(optimizer)][2])
            self._wrappers[id(optimizer)] = wrapped
            return wrapped
        return super().wrap_optimizer(optimizer, device_placement)

    def wrap_scheduler(self, scheduler: Any, optimizers: Any, step_with_optimizer: bool, split_batches: bool) -> Any:
        if id(scheduler) in self._schedulers:
            return MegatronSchedulerWrapper(scheduler, self._wrappers[id(scheduler.optimizer)])
        return super().wrap_scheduler(scheduler, optimizers, step_with_optimizer, split_batches)

    # -- training step --------------------------------------------------------------------------------

    def backward(self, loss: torch.Tensor, accumulation_steps: int = 1, **kwargs: Any) -> None:
        """Nothing left to compute: the prepared model's call ran megatron-core's forward-backward."""

    def clip_grad_norm_(
        self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float, optimizers: Iterable[Any]
    ) -> torch.Tensor:
        """megatron-core clips in its optimizer step (``MegatronLMPlugin.gradient_clipping``): the last norm."""
        norms = [float(norm) for o in optimizers if (norm := getattr(o, "grad_norm", None)) is not None]
        return torch.tensor(norms[-1] if norms else 0.0)

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    # -- state ------------------------------------------------------------------------------------------

    def checkpoint_entries(self) -> dict[str, CheckpointEntry]:
        return {
            "model": CheckpointEntry(rf"^{MODEL_ENTRY}(?:_(\d+))?$", lambda i: f"{MODEL_ENTRY}_{i}", sharded=True),
            "optimizer": CheckpointEntry(
                rf"^{OPTIMIZER_ENTRY}_(\d+)$", lambda i: f"{OPTIMIZER_ENTRY}_{i}", sharded=True
            ),
        }

    def checkpoint_weights(self, model: torch.nn.Module) -> dict[str, Any] | None:
        return None

    def save_model_checkpoint(
        self, model: Any, weights: Any, folder: str, index: int, safe_serialization: bool, is_writer: bool
    ) -> str:
        name = self.checkpoint_entries()["model"].name(index)
        megatron_io.save(model.sharded_state_dict(), os.path.join(folder, name))
        return name

    def load_model_checkpoint(self, model: Any, folder: str, entry: str, device: Any, strict: bool = True) -> None:
        state = megatron_io.load(model.sharded_state_dict(), os.path.join(folder, entry))
        if len(model.module) == 1:
            model.module[0].load_state_dict(state, strict=strict)
        else:
            for i, chunk in enumerate(model.module):
                chunk.load_state_dict(state[f"model{i}"], strict=strict)

    def save_optimizer_checkpoint(self, optimizer: Any, folder: str, index: int, is_writer: bool) -> str:
        name = self.checkpoint_entries()["optimizer"].name(index)
        inner = optimizer.optimizer
        megatron_io.save(inner.sharded_state_dict(optimizer.engine.sharded_state_dict()), os.path.join(folder, name))
        return name

    def load_optimizer_checkpoint(self, optimizer: Any, folder: str, index: int, map_location: Any) -> None:
        inner = optimizer.optimizer
        path = os.path.join(folder, self.checkpoint_entries()["optimizer"].name(index))
        sharded = inner.sharded_state_dict(optimizer.engine.sharded_state_dict(), is_loading=True)
        inner.load_state_dict(megatron_io.load(sharded, path))


def _core_model(facts: Any, config: Any, other: dict[str, Any], pre: bool, post: bool, vp_stage: int | None) -> Any:
    """megatron-core's model of ``facts.family`` with megatron-core's local (non-TransformerEngine) layers."""
    if facts.family == "gpt":
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

        rope = other.get("use_rotary_position_embeddings") or other.get("position_embedding_type") == "rotary"
        return GPTModel(
            config=config,
            transformer_layer_spec=get_gpt_layer_local_spec(),
            vocab_size=facts.vocab_size,
            max_sequence_length=facts.max_position_embeddings,
            pre_process=pre,
            post_process=post,
            position_embedding_type="rope" if rope else "learned_absolute",
            vp_stage=vp_stage,
        )
    if facts.family == "bert":
        from megatron.core.models.bert.bert_layer_specs import bert_layer_local_spec
        from megatron.core.models.bert.bert_model import BertModel

        return BertModel(
            config=config,
            num_tokentypes=2,
            add_binary_head=False,
            transformer_layer_spec=bert_layer_local_spec,
            vocab_size=facts.vocab_size,
            max_sequence_length=facts.max_position_embeddings,
            pre_process=pre,
            post_process=post,
        )
    from megatron.core.models.T5 import T5Model
    from megatron.core.models.T5.t5_spec import (
        get_t5_decoder_with_local_block_spec,
        get_t5_encoder_with_local_block_spec,
    )

    return T5Model(
        config=config,
        encoder_config=config,
        transformer_encoder_layer_spec=get_t5_encoder_with_local_block_spec(facts.num_layers),
        transformer_decoder_layer_spec=get_t5_decoder_with_local_block_spec(facts.num_layers),
        vocab_size=facts.vocab_size,
        max_sequence_length=facts.max_position_embeddings,
        pre_process=pre,
        post_process=post,
    )
