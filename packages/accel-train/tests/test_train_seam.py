"""The seam of accel-train: connector, strategy and precision registries, plugins read from the launcher's
environment, checkpoint entries chosen by the strategy. Pure logic, one process."""

from __future__ import annotations

import contextlib
import os

import pytest
import torch
from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy, StateDictType

from accel_state.enums import DistributedType
from accel_train import Accelerator, connector
from accel_train.checkpointing import CheckpointMismatchError, check_contents
from accel_train.deepspeed_plugin import DeepSpeedPlugin
from accel_train.fsdp_plugin import FullyShardedDataParallelPlugin
from accel_train.kwargs_handlers import (
    AORecipeKwargs,
    AutocastKwargs,
    FP8RecipeKwargs,
    GradScalerKwargs,
    MSAMPRecipeKwargs,
    TERecipeKwargs,
)
from accel_train.megatron_plugin import MegatronLMPlugin
from accel_train.parallel_plugins import BackendNotAvailableError
from accel_train.parallelism_config import ParallelismConfig, TorchTensorParallelPlugin
from accel_train.precisions import PRECISIONS, precision_class, register_precision
from accel_train.precisions.amp import AutocastPrecision
from accel_train.precisions.base import Precision
from accel_train.strategies import STRATEGIES, register_strategy, strategy_class, strategy_name
from accel_train.strategies.base import CheckpointEntry, Strategy
from accel_train.strategies.ddp import DDPStrategy
from accel_train.strategies.single_device import SingleDeviceStrategy

# -- registries ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("distributed_type", "config", "name"),
    [
        (DistributedType.NO, None, "single_device"),
        (DistributedType.MULTI_CPU, None, "ddp"),
        (DistributedType.MULTI_GPU, None, "ddp"),
        (DistributedType.FSDP, None, "fsdp"),
        (DistributedType.DEEPSPEED, None, "deepspeed"),
        (DistributedType.MEGATRON_LM, None, "megatron_lm"),
        (DistributedType.MULTI_CPU, ParallelismConfig(dp_replicate_size=2), "ddp"),
        (DistributedType.MULTI_CPU, ParallelismConfig(tp_size=2), "nd_parallel"),
        (DistributedType.FSDP, ParallelismConfig(dp_shard_size=2), "nd_parallel"),
    ],
)
def test_strategy_name_follows_the_distributed_type_and_mesh(distributed_type, config, name) -> None:
    assert strategy_name(distributed_type, config) == name


def test_registered_strategies_load_by_name() -> None:
    assert strategy_class("single_device") is SingleDeviceStrategy
    assert strategy_class("ddp") is DDPStrategy
    assert strategy_class("megatron_lm").name == "megatron_lm" and strategy_class("xla").name == "xla"
    with pytest.raises(KeyError, match="no strategy named 'warp'.*registered"):
        strategy_class("warp")


def test_a_strategy_is_one_class_and_its_registration() -> None:
    class EchoStrategy(Strategy):
        name = "echo"

    register_strategy("echo", EchoStrategy)
    try:
        assert strategy_class("echo") is EchoStrategy
        with pytest.raises(ValueError, match="already registered"):
            register_strategy("echo", "somewhere:Else")
        with pytest.raises(ValueError, match="module:Class"):
            register_strategy("echo", "no_colon", replace=True)
    finally:
        STRATEGIES.pop("echo", None)


def test_precision_registry() -> None:
    assert precision_class("no") is Precision
    assert precision_class("bf16") is AutocastPrecision
    from accel_train.precisions.fp8 import FP8Precision

    assert precision_class("fp8") is FP8Precision
    with pytest.raises(ValueError, match="no precision for mixed_precision='fp4'"):
        precision_class("fp4")

    class Fp4(Precision):
        modes = ("fp4",)

    register_precision("fp4", Fp4)
    try:
        assert precision_class("fp4") is Fp4
    finally:
        PRECISIONS.pop("fp4", None)


# -- connector -----------------------------------------------------------------------------------------


def test_handlers_are_sorted_into_slots_once_each() -> None:
    slots = connector.sort_handlers([AutocastKwargs(enabled=False), GradScalerKwargs(init_scale=8.0)])
    assert isinstance(slots["autocast_handler"], AutocastKwargs)
    assert slots["scaler_handler"].init_scale == 8.0
    assert slots["ddp_handler"] is None
    with pytest.raises(ValueError, match="only pass one AutocastKwargs"):
        connector.sort_handlers([AutocastKwargs(), AutocastKwargs()])
    with pytest.raises(TypeError, match="KwargsHandler objects, got dict"):
        connector.sort_handlers([{"enabled": True}])  # type: ignore[list-item]


def test_connector_builds_components_for_one_process() -> None:
    built = connector.build(cpu=True, mixed_precision="bf16")
    assert isinstance(built.strategy, SingleDeviceStrategy)
    assert isinstance(built.precision, AutocastPrecision)
    assert built.strategy.precision is built.precision
    assert built.precision.scaler is None and built.precision.dtype is torch.bfloat16


def test_connector_gives_the_strategy_scaler_to_fp16() -> None:
    made: list[str] = []

    class CountingScaler(torch.amp.GradScaler):
        def __init__(self, device: str = "cpu", **kwargs) -> None:
            made.append(device)
            super().__init__(device, **kwargs)

    class ScalingStrategy(SingleDeviceStrategy):
        @classmethod
        def grad_scaler_factory(cls):
            return CountingScaler

    register_strategy("single_device", ScalingStrategy, replace=True)
    try:
        accelerator = Accelerator(cpu=True, mixed_precision="fp16")
        assert made == ["cpu"] and isinstance(accelerator.scaler, CountingScaler)
    finally:
        register_strategy("single_device", SingleDeviceStrategy, replace=True)


def test_a_precision_limited_to_some_strategies_is_refused_elsewhere() -> None:
    class DdpOnly(Precision):
        supported_strategies = frozenset({"ddp"})

    register_precision("no", DdpOnly, replace=True)
    try:
        with pytest.raises(ValueError, match="cannot run with the single_device strategy; it runs with \\['ddp'\\]"):
            Accelerator(cpu=True)
    finally:
        register_precision("no", Precision, replace=True)


def test_unknown_backend_is_refused_at_prepare_not_construction() -> None:
    accelerator = Accelerator(cpu=True, megatron_lm_plugin=MegatronLMPlugin())
    assert accelerator.distributed_type == DistributedType.MEGATRON_LM
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(4, 2)), batch_size=2)
    assert len(accelerator.prepare(data)) == 2  # data loaders still prepare
    with pytest.raises(BackendNotAvailableError, match="Megatron-LM"):
        accelerator.prepare(torch.nn.Linear(2, 2))


def test_plugins_of_different_backends_conflict() -> None:
    with pytest.raises(ValueError, match="only one of DeepSpeed, FSDP and Megatron-LM"):
        Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin(), megatron_lm_plugin=MegatronLMPlugin())
    with pytest.raises(TypeError, match="deepspeed_plugins\\['a'\\] must be a DeepSpeedPlugin"):
        Accelerator(cpu=True, deepspeed_plugins={"a": object()})
    with pytest.raises(ValueError, match="empty dict"):
        Accelerator(cpu=True, deepspeed_plugins={})


def test_tp_plugin_becomes_a_parallelism_config(monkeypatch: pytest.MonkeyPatch) -> None:
    built = connector._plugins(None, None, None, None, TorchTensorParallelPlugin(tp_size=2), None)
    assert built["parallelism_config"].tp_size == 2
    with pytest.raises(ValueError, match="contradicts parallelism_config.tp_size=4"):
        connector._plugins(None, None, None, None, TorchTensorParallelPlugin(tp_size=2), ParallelismConfig(tp_size=4))


# -- the Accelerator's attributes come from the components ---------------------------------------------


def test_attributes_answer_from_the_strategy_and_precision() -> None:
    class MeshStrategy(SingleDeviceStrategy):
        device_mesh = "a mesh"  # type: ignore[assignment]
        is_composable_parallelism_enabled = True  # type: ignore[assignment]

        @property
        def parallel_dims(self):
            from accel_train.strategies.base import ParallelDims

            return ParallelDims(dp_shard_size=2, tp_size=2, dp_shard_rank=1, tp_rank=1, cp_rank=0)

    class Fp8Like(Precision):
        fp8_backend = "AO"  # type: ignore[assignment]

    register_strategy("single_device", MeshStrategy, replace=True)
    register_precision("no", Fp8Like, replace=True)
    try:
        accelerator = Accelerator(cpu=True)
        assert accelerator.torch_device_mesh == "a mesh"
        assert accelerator.is_composable_parallelism_enabled
        assert accelerator.fp8_backend == "AO"
        # data_parallel_rank is the dp_replicate rank (documented); this mesh has no dp_replicate
        assert (accelerator.data_parallel_rank, accelerator.data_parallel_shard_rank) == (0, 1)
        assert (accelerator.tensor_parallel_rank, accelerator.context_parallel_rank) == (1, 0)
    finally:
        register_strategy("single_device", SingleDeviceStrategy, replace=True)
        register_precision("no", Precision, replace=True)


def test_default_attributes_of_one_process() -> None:
    accelerator = Accelerator(cpu=True)
    assert accelerator.torch_device_mesh is None and accelerator.fp8_backend is None
    assert not accelerator.is_composable_parallelism_enabled
    assert accelerator.data_parallel_rank == accelerator.tensor_parallel_rank == 0


# -- the strategy's hooks are what the Accelerator calls -----------------------------------------------


def test_prepare_hands_models_optimizers_and_schedulers_to_the_strategy_together() -> None:
    calls: list[tuple[int, int, int, list[bool], int]] = []

    class Recording(SingleDeviceStrategy):
        def setup(self, models, optimizers, schedulers, device_placement, evaluation_mode=False, data_loaders=()):
            calls.append((len(models), len(optimizers), len(schedulers), list(device_placement), len(data_loaders)))
            return super().setup(models, optimizers, schedulers, device_placement, evaluation_mode, data_loaders)

    register_strategy("single_device", Recording, replace=True)
    try:
        accelerator = Accelerator(cpu=True)
        model = torch.nn.Linear(2, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
        data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(4, 2)), batch_size=2)
        out = accelerator.prepare(scheduler, data, optimizer, model, device_placement=[None, None, None, False])
        assert calls == [(1, 1, 1, [False], 1)]
        assert out[1] is accelerator._dataloaders[0]
        assert out[0].optimizers == [out[2]]  # the scheduler follows the prepared optimizer
    finally:
        register_strategy("single_device", SingleDeviceStrategy, replace=True)


def test_prepared_objects_are_marked_and_not_prepared_twice() -> None:
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(4, 2)), batch_size=2)
    prepared = accelerator.prepare(model, optimizer, data)
    assert all(obj._is_accelerate_prepared for obj in prepared)
    assert accelerator.prepare_model(prepared[0]) is prepared[0]
    again = accelerator.prepare(*prepared)
    assert all(a is b for a, b in zip(again, prepared))
    assert len(accelerator._models) == len(accelerator._optimizers) == len(accelerator._dataloaders) == 1


def test_backward_and_clipping_go_through_the_strategy() -> None:
    seen: list[tuple[str, object]] = []

    class Recording(SingleDeviceStrategy):
        def backward(self, loss, accumulation_steps=1, **kwargs):
            seen.append(("backward", accumulation_steps))
            super().backward(loss, accumulation_steps, **kwargs)

        def clip_grad_norm_(self, parameters, max_norm, norm_type, optimizers):
            seen.append(("clip", max_norm))
            return super().clip_grad_norm_(parameters, max_norm, norm_type, optimizers)

        def no_sync(self, model):
            seen.append(("no_sync", type(model).__name__))
            return contextlib.nullcontext()

    register_strategy("single_device", Recording, replace=True)
    try:
        accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
        model = accelerator.prepare(torch.nn.Linear(2, 1))
        accelerator.backward(model(torch.ones(3, 2)).sum())
        norm = accelerator.clip_grad_norm_(model.parameters(), 0.5)
        assert seen == [("backward", 2), ("clip", 0.5)]
        # sum of |d/dw| over 3 rows of ones, halved by accumulation: the norm is that of the raw gradients
        assert norm == pytest.approx(torch.tensor([1.5, 1.5, 1.5]).norm().item())
    finally:
        register_strategy("single_device", SingleDeviceStrategy, replace=True)


# -- plugins read what the launcher writes ------------------------------------------------------------


def test_fsdp_plugin_reads_every_launcher_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {
        "FSDP_VERSION": "1",
        "FSDP_SHARDING_STRATEGY": "SHARD_GRAD_OP",
        "FSDP_OFFLOAD_PARAMS": "true",
        "FSDP_MIN_NUM_PARAMS": "2000",
        "FSDP_AUTO_WRAP_POLICY": "SIZE_BASED_WRAP",
        "FSDP_TRANSFORMER_CLS_TO_WRAP": "Block,Layer",
        "FSDP_BACKWARD_PREFETCH": "BACKWARD_POST",
        "FSDP_FORWARD_PREFETCH": "true",
        "FSDP_STATE_DICT_TYPE": "SHARDED_STATE_DICT",
        "FSDP_USE_ORIG_PARAMS": "false",
        "FSDP_CPU_RAM_EFFICIENT_LOADING": "true",
        "FSDP_SYNC_MODULE_STATES": "true",
        "FSDP_ACTIVATION_CHECKPOINTING": "true",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    plugin = FullyShardedDataParallelPlugin()
    assert plugin.fsdp_version == 1 and plugin.sharding_strategy == ShardingStrategy.SHARD_GRAD_OP
    assert plugin.cpu_offload.offload_params is True and plugin.min_num_params == 2000
    assert plugin.auto_wrap_policy == "SIZE_BASED_WRAP" and plugin.transformer_cls_names_to_wrap == ["Block", "Layer"]
    assert plugin.backward_prefetch == BackwardPrefetch.BACKWARD_POST and plugin.forward_prefetch is True
    assert plugin.state_dict_type == StateDictType.SHARDED_STATE_DICT and plugin.use_orig_params is False
    assert plugin.cpu_ram_efficient_loading and plugin.sync_module_states and plugin.activation_checkpointing
    # What the script sets wins over the environment.
    assert FullyShardedDataParallelPlugin(sharding_strategy="NO_SHARD").sharding_strategy == ShardingStrategy.NO_SHARD


def test_fsdp2_plugin_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FSDP_VERSION", "2")
    monkeypatch.setenv("FSDP_RESHARD_AFTER_FORWARD", "false")
    plugin = FullyShardedDataParallelPlugin()
    assert plugin.fsdp_version == 2 and plugin.reshard_after_forward is False
    assert plugin.sharding_strategy is None and plugin.state_dict_type == StateDictType.SHARDED_STATE_DICT


def test_fsdp_plugin_defaults_without_a_launcher() -> None:
    plugin = FullyShardedDataParallelPlugin()
    assert (plugin.fsdp_version, plugin.sharding_strategy, plugin.state_dict_type) == (
        1,
        ShardingStrategy.FULL_SHARD,
        StateDictType.FULL_STATE_DICT,
    )
    assert plugin.use_orig_params and plugin.sync_module_states and not plugin.cpu_ram_efficient_loading
    assert FullyShardedDataParallelPlugin(sharding_strategy=4).sharding_strategy == ShardingStrategy.HYBRID_SHARD


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sharding_strategy": "HALF_SHARD"}, "sharding_strategy='HALF_SHARD' is not valid; choose one of"),
        ({"fsdp_version": 2, "sharding_strategy": "FULL_SHARD"}, "sharding_strategy is FSDP1 only"),
        ({"fsdp_version": 1, "reshard_after_forward": True}, "reshard_after_forward is FSDP2 only"),
        ({"fsdp_version": 2, "state_dict_type": "LOCAL_STATE_DICT"}, "LOCAL_STATE_DICT is FSDP1 only"),
        ({"state_dict_type": "PARTIAL"}, "state_dict_type='PARTIAL' is not valid"),
        ({"auto_wrap_policy": "layer_wrap"}, "auto_wrap_policy='LAYER_WRAP' is not valid"),
        ({"cpu_ram_efficient_loading": True, "sync_module_states": False}, "needs sync_module_states=True"),
    ],
)
def test_fsdp_plugin_bad_values(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FullyShardedDataParallelPlugin(**kwargs)


def test_deepspeed_plugin_reads_every_launcher_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {
        "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3",
        "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE": "cpu",
        "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE": "nvme",
        "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_NVME_PATH": "/nvme/opt",
        "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_NVME_PATH": "/nvme/param",
        "ACCELERATE_DEEPSPEED_ZERO3_INIT": "true",
        "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL": "true",
        "ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES": "MoE,Expert",
        "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "4",
        "ACCELERATE_GRADIENT_CLIPPING": "0.5",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    plugin = DeepSpeedPlugin()
    assert plugin.zero_stage == 3 and plugin.zero3_init_flag and plugin.zero3_save_16bit_model
    assert (plugin.offload_optimizer_device, plugin.offload_param_device) == ("cpu", "nvme")
    assert (plugin.offload_optimizer_nvme_path, plugin.offload_param_nvme_path) == ("/nvme/opt", "/nvme/param")
    assert plugin.transformer_moe_cls_names == "MoE,Expert"
    assert (plugin.gradient_accumulation_steps, plugin.gradient_clipping) == (4, 0.5)


def test_deepspeed_plugin_defaults_and_config_file(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    plugin = DeepSpeedPlugin()
    assert (plugin.zero_stage, plugin.offload_optimizer_device, plugin.offload_param_device) == (2, "none", "none")
    config_file = tmp_path / "ds.json"
    config_file.write_text('{"zero_optimization": {"stage": 3}}')
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_CONFIG_FILE", str(config_file))
    from_file = DeepSpeedPlugin()
    # With a config file, the file decides what the launcher did not set.
    assert from_file.hf_ds_config.is_zero3() and from_file.zero_stage == 3  # answered from the config (issue 30)
    assert from_file.deepspeed_config["zero_optimization"]["stage"] == 3
    with pytest.raises(ValueError, match="zero_stage=5 is not valid; choose one of \\[0, 1, 2, 3\\]"):
        DeepSpeedPlugin(zero_stage=5)
    with pytest.raises(ValueError, match="offload_param_device='gpu' is not valid"):
        DeepSpeedPlugin(offload_param_device="gpu")


def test_megatron_plugin_reads_the_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in {
        "MEGATRON_LM_TP_DEGREE": "2",
        "MEGATRON_LM_PP_DEGREE": "4",
        "MEGATRON_LM_NUM_MICRO_BATCHES": "8",
        "MEGATRON_LM_SEQUENCE_PARALLELISM": "true",
        "MEGATRON_LM_RECOMPUTE_ACTIVATIONS": "true",
        "MEGATRON_LM_USE_DISTRIBUTED_OPTIMIZER": "true",
        "MEGATRON_LM_GRADIENT_CLIPPING": "0.3",
    }.items():
        monkeypatch.setenv(key, value)
    plugin = MegatronLMPlugin()
    assert (plugin.tp_degree, plugin.pp_degree, plugin.num_micro_batches) == (2, 4, 8)
    assert plugin.sequence_parallelism and plugin.recompute_activations and plugin.use_distributed_optimizer
    assert plugin.gradient_clipping == 0.3


def test_parallelism_config_from_the_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ParallelismConfig.from_env() is None
    monkeypatch.setenv("ACCELERATE_USE_PARALLELISM_CONFIG", "true")
    monkeypatch.setenv("PARALLELISM_CONFIG_DP_SHARD_SIZE", "2")
    monkeypatch.setenv("PARALLELISM_CONFIG_CP_SIZE", "2")
    monkeypatch.setenv("PARALLELISM_CONFIG_CP_COMM_STRATEGY", "alltoall")
    config = ParallelismConfig.from_env()
    assert config is not None
    assert (config.dp_replicate_size, config.dp_shard_size, config.tp_size, config.cp_size) == (1, 2, 1, 2)
    assert config.cp_handler.cp_comm_strategy == "alltoall" and config.total_size == 4
    with pytest.raises(ValueError, match="tp_size must be an int >= 1, got 0"):
        ParallelismConfig(tp_size=0)


def test_fp8_recipes_read_the_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    assert TERecipeKwargs().fp8_format == "HYBRID" and MSAMPRecipeKwargs().opt_level == "O2"
    for key, value in {
        "ACCELERATE_FP8_BACKEND": "MSAMP",
        "ACCELERATE_FP8_FORMAT": "E4M3",
        "ACCELERATE_FP8_AMAX_HISTORY_LEN": "16",
        "ACCELERATE_FP8_AMAX_COMPUTE_ALGO": "max",
        "ACCELERATE_FP8_MARGIN": "2",
        "ACCELERATE_FP8_INTERVAL": "3",
        "ACCELERATE_FP8_OVERRIDE_LINEAR_PRECISION": "false,true,false",
        "ACCELERATE_FP8_OPT_LEVEL": "O1",
        "ACCELERATE_FP8_USE_AUTOCAST_DURING_EVAL": "true",
        "ACCELERATE_FP8_PAD_INNER_DIM": "false",
        "ACCELERATE_FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER": "false",
    }.items():
        monkeypatch.setenv(key, value)
    te = TERecipeKwargs()
    assert (te.fp8_format, te.amax_history_len, te.amax_compute_algo, te.margin, te.interval) == (
        "E4M3",
        16,
        "max",
        2,
        3,
    )
    assert te.override_linear_precision == (False, True, False) and te.use_autocast_during_eval is True
    assert MSAMPRecipeKwargs().opt_level == "O1"
    ao = AORecipeKwargs()
    assert ao.pad_inner_dim is False and ao.enable_fsdp_float8_all_gather is False
    umbrella = FP8RecipeKwargs()
    assert (umbrella.backend, umbrella.opt_level) == ("MSAMP", "O1")


def test_fp8_recipe_spellings_and_errors() -> None:
    assert FP8RecipeKwargs(backend="msamp", optimization_level="O1").opt_level == "O1"
    assert TERecipeKwargs(override_linear_precision=True).override_linear_precision == (True, True, True)
    with pytest.raises(ValueError, match="disagree"):
        FP8RecipeKwargs(opt_level="O1", optimization_level="O2")
    with pytest.raises(ValueError, match="three booleans"):
        TERecipeKwargs(override_linear_precision=(True, False))
    with pytest.raises(ValueError, match="backend"):
        FP8RecipeKwargs(backend="fp4-magic")


# -- checkpoint entries come from the strategy ----------------------------------------------------------


def test_check_contents_uses_the_strategy_layout(tmp_path) -> None:
    (tmp_path / "pytorch_model_fsdp_0").mkdir()
    (tmp_path / "optimizer_0").mkdir()
    (tmp_path / "random_states_0.safetensors").write_bytes(b"")
    layout = {
        "model": CheckpointEntry(r"^pytorch_model_fsdp_(\d+)$", lambda i: f"pytorch_model_fsdp_{i}"),
        "optimizer": CheckpointEntry(r"^optimizer_(\d+)$", lambda i: f"optimizer_{i}"),
    }
    names = check_contents(str(tmp_path), 1, 1, 0, 0, 0, False, 0, 1, None, layout=layout)
    assert names == ["pytorch_model_fsdp_0"]
    with pytest.raises(CheckpointMismatchError, match="pytorch_model_fsdp_1 \\(model 1; 2 prepared\\)"):
        check_contents(str(tmp_path), 2, 1, 0, 0, 0, False, 0, 1, None, layout=layout)
    # Without the layout the same folder lacks the documented single files.
    with pytest.raises(CheckpointMismatchError, match="model.safetensors"):
        check_contents(str(tmp_path), 1, 1, 0, 0, 0, False, 0, 1, None)
    assert os.path.isdir(tmp_path / "optimizer_0")


# -- state dicts of models dispatched with offload ------------------------------------------------------


@pytest.mark.parametrize("where", ["cpu", "disk"])
@pytest.mark.parametrize("safe", [True, False])
def test_save_model_of_an_offloaded_model_writes_the_real_weights(tmp_path, where: str, safe: bool) -> None:
    from accel_bigmodel import cpu_offload, disk_offload, load_checkpoint_in_model

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(3, 4)
    reference = model(x)
    if where == "cpu":
        cpu_offload(model, execution_device=torch.device("cpu"))
    else:
        disk_offload(model, offload_dir=str(tmp_path / "offload"), execution_device=torch.device("cpu"))
    assert any(p.device.type == "meta" for p in model.parameters())
    accelerator = Accelerator(cpu=True)
    accelerator.save_model(model, tmp_path / "saved", safe_serialization=safe)
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    load_checkpoint_in_model(fresh, str(tmp_path / "saved"))
    for key, value in fresh.state_dict().items():
        assert torch.equal(value, expected[key]), key
    assert torch.allclose(fresh(x), reference)


def test_a_meta_weight_without_an_offload_hook_is_named() -> None:
    with torch.device("meta"):
        model = torch.nn.Linear(2, 2)
    accelerator = Accelerator(cpu=True)
    with pytest.raises(ValueError, match="meta device and no offload hook.*'weight'"):
        accelerator.get_state_dict(model)
