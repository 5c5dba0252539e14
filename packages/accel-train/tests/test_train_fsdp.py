"""FSDP in one process: the plugin's checks, wrap rules, policies, utilities, one-process checkpoints."""

from __future__ import annotations

import os

import pytest
import torch
from fsdp_helpers import Block, BlockNet
from torch.distributed.fsdp import CPUOffloadPolicy, StateDictType

from accel_state.environment import patch_environment
from accel_state.testing import reset_shared_state
from accel_train import FullyShardedDataParallelPlugin
from accel_train.fsdp_wrap import (
    block_class_names,
    fsdp1_mixed_precision,
    fsdp2_mixed_precision_policy,
    ignored_modules_of,
    resolve_wrap_classes,
    wrap_units,
)

# -- the plugin -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"fsdp_version": 2, "sharding_strategy": "FULL_SHARD"}, "sharding_strategy is FSDP1 only"),
        ({"fsdp_version": 1, "reshard_after_forward": True}, "reshard_after_forward is FSDP2 only"),
        ({"fsdp_version": 2, "state_dict_type": "LOCAL_STATE_DICT"}, "LOCAL_STATE_DICT is FSDP1 only"),
        ({"fsdp_version": 2, "use_orig_params": False}, "use_orig_params=False is FSDP1 only"),
        ({"fsdp_version": 3}, "fsdp_version=3 is not valid"),
        ({"sharding_strategy": "HALF_SHARD"}, "sharding_strategy='HALF_SHARD' is not valid"),
        (
            {"cpu_ram_efficient_loading": True, "sync_module_states": False},
            "cpu_ram_efficient_loading=True needs sync_module_states=True",
        ),
        (
            {"fsdp_version": 2, "cpu_ram_efficient_loading": True, "sync_module_states": False},
            "needs sync_module_states=True",
        ),
    ],
)
def test_plugin_refuses_bad_combinations(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FullyShardedDataParallelPlugin(**kwargs)


def test_plugin_refuses_policy_objects_of_the_other_version() -> None:
    from torch.distributed.fsdp import CPUOffload, CPUOffloadPolicy, MixedPrecision, MixedPrecisionPolicy

    with pytest.raises(ValueError, match="FSDP2 MixedPrecisionPolicy but fsdp_version=1"):
        FullyShardedDataParallelPlugin(fsdp_version=1, mixed_precision_policy=MixedPrecisionPolicy())
    with pytest.raises(ValueError, match="FSDP1 MixedPrecision but fsdp_version=2"):
        FullyShardedDataParallelPlugin(fsdp_version=2, mixed_precision_policy=MixedPrecision())
    with pytest.raises(ValueError, match="CPUOffloadPolicy is FSDP2 only"):
        FullyShardedDataParallelPlugin(fsdp_version=1, cpu_offload=CPUOffloadPolicy())
    with pytest.raises(ValueError, match="CPUOffload is FSDP1 only"):
        FullyShardedDataParallelPlugin(fsdp_version=2, cpu_offload=CPUOffload(offload_params=True))


def test_plugin_reads_the_launcher_environment() -> None:
    env = {
        "FSDP_VERSION": "2",
        "FSDP_RESHARD_AFTER_FORWARD": "false",
        "FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP",
        "FSDP_TRANSFORMER_CLS_TO_WRAP": "Block,Other",
        "FSDP_STATE_DICT_TYPE": "FULL_STATE_DICT",
        "FSDP_OFFLOAD_PARAMS": "true",
        "FSDP_ACTIVATION_CHECKPOINTING": "true",
        "FSDP_CPU_RAM_EFFICIENT_LOADING": "true",
        "FSDP_SYNC_MODULE_STATES": "true",
    }
    with patch_environment(**env):
        plugin = FullyShardedDataParallelPlugin()
        overridden = FullyShardedDataParallelPlugin(reshard_after_forward=True)
    assert plugin.fsdp_version == 2 and plugin.reshard_after_forward is False
    assert plugin.auto_wrap_policy == "TRANSFORMER_BASED_WRAP"
    assert plugin.transformer_cls_names_to_wrap == ["Block", "Other"]
    assert plugin.state_dict_type == StateDictType.FULL_STATE_DICT
    assert isinstance(plugin.cpu_offload, CPUOffloadPolicy) and plugin.activation_checkpointing is True
    assert plugin.cpu_ram_efficient_loading is True
    assert overridden.reshard_after_forward is True


def test_plugin_picks_the_wrap_policy_from_code_values() -> None:
    assert FullyShardedDataParallelPlugin(transformer_cls_names_to_wrap=["Block"]).auto_wrap_policy == (
        "TRANSFORMER_BASED_WRAP"
    )
    assert FullyShardedDataParallelPlugin(min_num_params=10).auto_wrap_policy == "SIZE_BASED_WRAP"
    assert FullyShardedDataParallelPlugin().auto_wrap_policy is None
    assert FullyShardedDataParallelPlugin(fsdp_version=2).state_dict_type == StateDictType.SHARDED_STATE_DICT
    assert FullyShardedDataParallelPlugin(fsdp_version=1).state_dict_type == StateDictType.FULL_STATE_DICT


# -- wrap rules -------------------------------------------------------------------------------------


def test_unknown_wrap_class_is_named_with_the_models_blocks() -> None:
    with pytest.raises(
        ValueError, match=r"\['BertLayer'\] to wrap match no module of BlockNet; its block classes are \['Block'\]"
    ):
        resolve_wrap_classes(BlockNet(), ["Block", "BertLayer"])
    assert block_class_names(BlockNet()) == ["Block"]


def test_transformer_wrap_uses_no_split_modules() -> None:
    model = BlockNet(depth=3)
    units = wrap_units(model, FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="TRANSFORMER_BASED_WRAP"))
    assert units == list(model.blocks)
    plain = torch.nn.Sequential(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="needs the layer classes to wrap"):
        wrap_units(plain, FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="TRANSFORMER_BASED_WRAP"))


def test_size_based_and_no_wrap_units() -> None:
    model = BlockNet(width=8)  # each block: 2 * (8 * 16 + 16) ... 288 parameters
    per_block = sum(p.numel() for p in model.blocks[0].parameters())
    units = wrap_units(model, FullyShardedDataParallelPlugin(min_num_params=per_block))
    assert units == list(model.blocks)
    none = wrap_units(model, FullyShardedDataParallelPlugin(auto_wrap_policy="NO_WRAP"))
    assert none == []
    custom = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy=lambda m: isinstance(m, torch.nn.Linear))
    assert len(wrap_units(model, custom)) == 6


def test_ignored_modules_by_name_or_object() -> None:
    model = BlockNet()
    assert ignored_modules_of(model, r"blocks\.1") == [model.blocks[1]]
    assert ignored_modules_of(model, [model.head]) == [model.head]
    with pytest.raises(ValueError, match="matches no submodule"):
        ignored_modules_of(model, "nothing")
    with pytest.raises(ValueError, match="not part of the model"):
        ignored_modules_of(model, [torch.nn.Linear(1, 1)])


def test_mixed_precision_policies() -> None:
    bf16 = (torch.bfloat16, torch.bfloat16, torch.bfloat16)
    v1 = fsdp1_mixed_precision(None, bf16)
    assert v1.param_dtype == torch.bfloat16 and v1.buffer_dtype == torch.bfloat16
    assert fsdp1_mixed_precision(None, (None, None, None)) is None
    v2 = fsdp2_mixed_precision_policy({"param_dtype": "bf16", "reduce_dtype": "fp32"}, (None, None, None))
    assert v2.param_dtype == torch.bfloat16 and v2.reduce_dtype == torch.float32
    with pytest.raises(ValueError, match="unknown keys"):
        fsdp2_mixed_precision_policy({"param": "bf16"}, bf16)
    with pytest.raises(ValueError, match="is not a dtype"):
        fsdp1_mixed_precision({"param_dtype": "int3"}, bf16)


@pytest.mark.parametrize(("mode", "dtype"), [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_policy_from_mixed_precision_is_the_documented_one(mode: str, dtype: torch.dtype) -> None:
    """As the documented plugin builds it from ``mixed_precision``: FSDP2 casts the outputs too
    (``output_dtype``), FSDP1 the buffers (``buffer_dtype``)."""
    from torch.distributed.fsdp import MixedPrecision, MixedPrecisionPolicy

    from accel_train import Accelerator

    v2 = FullyShardedDataParallelPlugin(fsdp_version=2)
    Accelerator(cpu=True, mixed_precision=mode, fsdp_plugin=v2)
    assert v2.mixed_precision_policy == MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype, output_dtype=dtype)
    assert fsdp2_mixed_precision_policy(None, (dtype, dtype, dtype)).output_dtype == dtype
    assert fsdp2_mixed_precision_policy(mode, (None, None, None)).output_dtype == dtype
    assert fsdp2_mixed_precision_policy({"param_dtype": mode}, (None, None, None)).output_dtype is None  # as given
    assert fsdp2_mixed_precision_policy(None, (None, None, None)) == MixedPrecisionPolicy()  # fp32: no casts
    reset_shared_state()
    v1 = FullyShardedDataParallelPlugin(fsdp_version=1)
    Accelerator(cpu=True, mixed_precision=mode, fsdp_plugin=v1)
    assert v1.mixed_precision_policy == MixedPrecision(param_dtype=dtype, reduce_dtype=dtype, buffer_dtype=dtype)


# -- utilities --------------------------------------------------------------------------------------


def test_ram_efficient_loading_switches() -> None:
    from accel_train.fsdp_utils import disable_fsdp_ram_efficient_loading, enable_fsdp_ram_efficient_loading

    with patch_environment(FSDP_CPU_RAM_EFFICIENT_LOADING="False"):
        enable_fsdp_ram_efficient_loading()
        assert os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] == "True"
        disable_fsdp_ram_efficient_loading()
        assert os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] == "False"


def test_canonical_names_and_optimizer_switch() -> None:
    from accel_train.fsdp_utils import fsdp2_canonicalize_names, fsdp2_switch_optimizer_parameters

    names = fsdp2_canonicalize_names({"_orig_mod._fsdp_wrapped_module.blocks.0._checkpoint_wrapped_module.w": 1})
    assert names == {"blocks.0.w": 1}
    old = torch.nn.Parameter(torch.ones(2))
    new = torch.nn.Parameter(torch.zeros(1))
    keep = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([old, keep], lr=0.1)
    fsdp2_switch_optimizer_parameters(optimizer, {old: new})
    assert optimizer.param_groups[0]["params"][0] is new and optimizer.param_groups[0]["params"][1] is keep


def test_ensure_weights_retied_after_meta_init() -> None:
    from accel_train.fsdp_utils import ensure_weights_retied

    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(4, 3)
            self.out = torch.nn.Linear(3, 4, bias=False)
            self.out.weight = self.emb.weight

    with torch.device("meta"):
        model = Tied()
    assert ensure_weights_retied(None, torch.nn.Linear(2, 2), "cpu") is None
    init = ensure_weights_retied(None, model, "cpu")
    for module in (model.emb, model.out):
        init(module)
    assert model.out.weight is model.emb.weight and model.emb.weight.device.type == "cpu"


def test_fsdp2_grad_scaler_is_sharded() -> None:
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    from accel_train.fsdp_utils import get_fsdp2_grad_scaler

    scaler = get_fsdp2_grad_scaler(device="cpu", init_scale=8.0)
    assert isinstance(scaler, ShardedGradScaler) and scaler.get_scale() == 8.0


# -- one process, not launched (plain python): the model stays whole, checkpoints keep the FSDP layout -----


def _one_process(tmp_path, state_dict_type: str):
    from accel_train import Accelerator

    accelerator = Accelerator(
        cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type=state_dict_type)
    )
    torch.manual_seed(0)
    model = BlockNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.backward(model(torch.ones(2, 4)).sum())
    optimizer.step()
    return accelerator, model, optimizer


def test_one_process_sharded_save_load_and_merge(tmp_path) -> None:
    from accel_train.checkpoint.file_io import load_weights
    from accel_train.commands.merge import main as merge_main

    accelerator, model, optimizer = _one_process(tmp_path, "SHARDED_STATE_DICT")
    assert accelerator.distributed_type == "FSDP" and isinstance(model, BlockNet)
    folder = str(tmp_path / "ckpt")
    accelerator.save_state(folder)
    assert {"pytorch_model_fsdp_0", "optimizer_0"} <= set(os.listdir(folder))
    expected = {k: v.clone() for k, v in accelerator.get_state_dict(model).items()}
    saved_moments = optimizer.state_dict()["state"][0]["exp_avg"].clone()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    optimizer.optimizer.state.clear()
    accelerator.load_state(folder)
    state = accelerator.get_state_dict(model)
    assert all(torch.equal(state[k], expected[k]) for k in expected)
    assert torch.equal(optimizer.state_dict()["state"][0]["exp_avg"], saved_moments)
    assert merge_main([folder, str(tmp_path / "merged")]) == 0
    merged = load_weights(str(tmp_path / "merged" / "model.safetensors"))
    assert all(torch.equal(merged[k], expected[k]) for k in expected)
    assert merge_main([folder, str(tmp_path / "pieces"), "--max_shard_size", "1000"]) == 0
    assert (tmp_path / "pieces" / "model.safetensors.index.json").is_file()
    assert merge_main([str(tmp_path), str(tmp_path / "x")]) == 2


def test_one_process_full_checkpoint_and_utilities(tmp_path) -> None:
    from accel_train.fsdp_utils import load_fsdp_model, load_fsdp_optimizer, save_fsdp_model, save_fsdp_optimizer

    accelerator, model, optimizer = _one_process(tmp_path, "FULL_STATE_DICT")
    folder = str(tmp_path / "ckpt")
    accelerator.save_state(folder)
    assert {"model.safetensors", "optimizer.bin"} <= set(os.listdir(folder))
    plugin = accelerator.state.fsdp_plugin
    path = save_fsdp_model(plugin, accelerator, model, str(tmp_path / "by_hand"))
    save_fsdp_optimizer(plugin, accelerator, optimizer, model, str(tmp_path / "by_hand"))
    assert path.endswith("model.safetensors") and os.path.isfile(tmp_path / "by_hand" / "optimizer.bin")
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.head.weight.add_(1.0)
    load_fsdp_model(plugin, accelerator, model, str(tmp_path / "by_hand"))
    load_fsdp_optimizer(plugin, accelerator, optimizer, model, str(tmp_path / "by_hand"))
    assert torch.equal(model.head.weight, expected["head.weight"])
    accelerator.load_state(folder)
    assert torch.equal(model.head.weight, expected["head.weight"])


def test_shape_mismatch_in_a_full_checkpoint_names_the_tensor(tmp_path) -> None:
    from accel_train.fsdp_utils import load_fsdp_model, save_fsdp_model

    accelerator, model, _ = _one_process(tmp_path, "FULL_STATE_DICT")
    plugin = accelerator.state.fsdp_plugin
    save_fsdp_model(plugin, accelerator, model, str(tmp_path / "m"))
    with pytest.raises(ValueError, match=r"inp.weight: checkpoint \(8, 4\), model \(16, 4\)"):
        load_fsdp_model(plugin, accelerator, BlockNet(width=16), str(tmp_path / "m"))


def test_block_helper_is_a_module() -> None:
    assert isinstance(Block(4), torch.nn.Module)
