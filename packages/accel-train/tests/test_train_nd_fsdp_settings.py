"""Each FSDP plugin setting under the ND-parallel strategy takes effect (the FSDP strategy's FSDP2 path) or
is refused by name. Two real gloo processes, ``ParallelismConfig(dp_shard_size=2)``."""

from __future__ import annotations

import pytest
import torch
from fsdp_helpers import BlockNet

from accel_state.testing import DistributedPool


def _accelerator(**plugin_fields):
    from accel_state.testing import reset_shared_state

    reset_shared_state()
    from accel_train import Accelerator, FullyShardedDataParallelPlugin
    from accel_train.parallelism_config import ParallelismConfig

    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, **plugin_fields)
    return Accelerator(parallelism_config=ParallelismConfig(dp_shard_size=2), fsdp_plugin=plugin)


SETTINGS = {
    "mixed_precision_policy": {"param_dtype": "bf16", "reduce_dtype": "fp32"},
    "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
    "transformer_cls_names_to_wrap": ["Block"],
    "forward_prefetch": True,
    "activation_checkpointing": True,
}


def rank_settings_take_effect(settings: dict) -> dict:
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    torch.manual_seed(0)
    model = BlockNet(width=8, depth=3)
    accelerator = _accelerator(**settings)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    seen: list[torch.dtype] = []
    inner = getattr(model.blocks[0], "_checkpoint_wrapped_module", model.blocks[0])  # checkpointing wraps it
    handle = inner.up.register_forward_hook(lambda module, args, out: seen.append(module.weight.dtype))
    loss = model(torch.randn(4, 4)).float().pow(2).mean()
    accelerator.backward(loss)
    optimizer.step()
    handle.remove()
    return {
        "units": [isinstance(block, FSDPModule) for block in model.blocks],
        "head_sharded": isinstance(model.head, FSDPModule) or isinstance(model.head.weight, DTensor),
        "inp_sharded": isinstance(model.inp.weight, DTensor),
        "forward_dtype": str(seen[0]),
        "prefetch": [
            len(block._get_fsdp_state()._states_to_forward_prefetch)  # set_modules_to_forward_prefetch's record
            for block in model.blocks
        ],
        "checkpointed": [type(block).__name__ for block in model.blocks],
    }


def test_fsdp_settings_take_effect_under_nd(dist_pool: DistributedPool) -> None:
    for result in dist_pool.run(rank_settings_take_effect, SETTINGS):
        assert result["units"] == [True, True, True]  # auto_wrap_policy + transformer_cls_names_to_wrap
        assert all(name.endswith("CheckpointWrapper") for name in result["checkpointed"])  # activation_checkpointing
        assert result["forward_dtype"] == "torch.bfloat16"  # mixed_precision_policy
        assert result["prefetch"] == [1, 1, 0]  # forward_prefetch: each unit prefetches the next
        assert result["head_sharded"] and result["inp_sharded"]


def test_ignored_modules_under_nd_stay_whole(dist_pool: DistributedPool) -> None:
    for result in dist_pool.run(rank_settings_take_effect, {"ignored_modules": "head"}):
        assert not result["head_sharded"] and result["inp_sharded"]  # ignored_modules
        assert result["forward_dtype"] == "torch.float32" and result["prefetch"] == [0, 0, 0]


def rank_refused(field: str, value: object) -> str:
    extra = {"sync_module_states": True} if field == "cpu_ram_efficient_loading" else {}
    try:
        _accelerator(**{field: value}, **extra)
    except ValueError as error:
        return str(error)
    return "accepted"


@pytest.mark.parametrize(
    ("field", "value"), [("cpu_ram_efficient_loading", True), ("state_dict_type", "FULL_STATE_DICT")]
)
def test_fsdp_settings_the_nd_strategy_cannot_honour_are_refused_by_name(
    dist_pool: DistributedPool, field: str, value: object
) -> None:
    for message in dist_pool.run(rank_refused, field, value):
        assert f"FullyShardedDataParallelPlugin.{field}" in message and "ParallelismConfig" in message
