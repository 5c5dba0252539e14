"""FSDP1 and FSDP2 on two real gloo processes: training equals DDP, sharded and full checkpoints,
resume, merge, RAM-efficient loading, bad checkpoints."""

from __future__ import annotations

import os

import pytest
import torch
from fsdp_helpers import BlockNet, local_numel, mse, num_params, regression_batches

from accel_state.testing import DistributedPool, reset_shared_state

STEPS = 4
GLOBAL_BATCH = 8


def _fresh(plugin_kwargs: dict | None, **kwargs):
    reset_shared_state()
    from accel_train import Accelerator, FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(**plugin_kwargs) if plugin_kwargs is not None else None
    return Accelerator(fsdp_plugin=plugin, **kwargs)


def _train(accelerator, model, optimizer, batches, accumulation: int = 1) -> torch.Tensor:
    """Run the batches (each rank its half); returns the last gradient norm."""
    rank, world = accelerator.process_index, accelerator.num_processes
    norm = torch.tensor(0.0)
    for x, y in batches:
        share = x.shape[0] // world
        x, y = x[rank * share : (rank + 1) * share], y[rank * share : (rank + 1) * share]
        with accelerator.accumulate(model):
            accelerator.backward(mse(model(x), y))
            if accelerator.sync_gradients:
                norm = accelerator.clip_grad_norm_(model.parameters(), 10.0)
            optimizer.step()
            optimizer.zero_grad()
    return norm


# -- rank functions ---------------------------------------------------------------------------------


def rank_train(plugin_kwargs: dict | None, optimizer_first: bool, accumulation: int) -> dict:
    accelerator = _fresh(plugin_kwargs, gradient_accumulation_steps=accumulation)
    torch.manual_seed(0)
    model = BlockNet()
    total = num_params(model)
    if optimizer_first:
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
        model, optimizer = accelerator.prepare(model, optimizer)
    else:
        model = accelerator.prepare(model)
        optimizer = accelerator.prepare(torch.optim.AdamW(model.parameters(), lr=0.01))
    norm = _train(accelerator, model, optimizer, regression_batches(STEPS * accumulation, GLOBAL_BATCH), accumulation)
    facts = {"type": type(model).__name__, "local": local_numel(model), "total": total, "norm": float(norm)}
    if type(model).__name__ == "FullyShardedDataParallel":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        units = FSDP.fsdp_modules(model)
        facts["units"] = sorted(type(u.module).__name__ for u in units)
        facts["sharding"] = model.sharding_strategy.name
    else:
        from torch.distributed.fsdp import FSDPModule

        facts["units"] = sorted(
            type(m).__name__.removeprefix("FSDP") for m in model.modules() if isinstance(m, FSDPModule)
        )
    facts["state"] = accelerator.get_state_dict(model)
    return facts


def rank_resume(plugin_kwargs: dict, folder: str, save_at: int | None, load: bool) -> dict:
    """6 steps (the learning rate halves after the first); saves after ``save_at`` steps, or resumes there."""
    accelerator = _fresh(plugin_kwargs)
    torch.manual_seed(0)
    model = BlockNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    batches = regression_batches(6, GLOBAL_BATCH)
    first, last = 0, len(batches)
    if load:
        accelerator.load_state(folder)
        first = save_at
    elif save_at is not None:
        last = save_at
    for index in range(first, last):
        _train(accelerator, model, optimizer, [batches[index]])
        if index == 0:
            scheduler.step()
    out = {"state": accelerator.get_state_dict(model), "lr": scheduler.get_last_lr()[0]}
    if save_at is not None and not load:
        accelerator.save_state(folder)
        out["files"] = sorted(os.listdir(folder))
        accelerator.save_model(model, folder + "_model", max_shard_size="1KB")
    return out


def rank_ram_efficient(version: int) -> dict:
    accelerator = _fresh({"fsdp_version": version, "cpu_ram_efficient_loading": True, "sync_module_states": True})
    torch.manual_seed(0)
    reference = {k: v.clone() for k, v in BlockNet().state_dict().items()}
    if accelerator.is_main_process:
        torch.manual_seed(0)
        model = BlockNet()
    else:
        from accel_bigmodel import init_empty_weights

        with init_empty_weights():
            model = BlockNet()
    model = accelerator.prepare(model)
    out = model(torch.ones(2, 4))
    state = accelerator.get_state_dict(model)
    return {
        "equal": all(torch.equal(state[k], reference[k]) for k in reference),
        "output": out.detach(),
        "type": type(model).__name__,
    }


def rank_save_mid_accumulation(folder: str) -> str:
    accelerator = _fresh({"fsdp_version": 1}, gradient_accumulation_steps=2)  # FSDP2 saves it (see the trust tests)
    model = BlockNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    _train(accelerator, model, optimizer, regression_batches(1, GLOBAL_BATCH))
    try:
        accelerator.save_state(folder)
    except ValueError as error:
        return str(error)
    return "saved"


def rank_load_mismatch(folder: str, width: int) -> str:
    accelerator = _fresh({"fsdp_version": 2})
    accelerator.prepare(BlockNet(width=width))
    if width == 8:
        accelerator.save_state(folder)
        return "saved"
    try:
        accelerator.load_state(folder)
    except ValueError as error:
        return str(error)
    return "no error"


OPTION_CASES = {
    "fsdp2-baseline": {"fsdp_version": 2},
    "fsdp1-activation-checkpointing": {"fsdp_version": 1, "activation_checkpointing": True},
    "fsdp2-activation-checkpointing-forward-prefetch": {
        "fsdp_version": 2,
        "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "activation_checkpointing": True,
        "forward_prefetch": True,
    },
    "fsdp1-hybrid-shard": {"fsdp_version": 1, "sharding_strategy": "HYBRID_SHARD", "min_num_params": 200},
    "fsdp1-hybrid-shard-zero2": {"fsdp_version": 1, "sharding_strategy": "HYBRID_SHARD_ZERO2"},
    "fsdp1-no-shard": {"fsdp_version": 1, "sharding_strategy": "NO_SHARD"},
    "fsdp1-cpu-offload-on-cpu": {"fsdp_version": 1, "cpu_offload": True},
    "fsdp2-cpu-offload-on-cpu": {"fsdp_version": 2, "cpu_offload": True},
    "fsdp1-flat-parameters": {
        "fsdp_version": 1,
        "use_orig_params": False,
        "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
    },
}


def rank_options() -> dict:
    out = {}
    for name, plugin_kwargs in OPTION_CASES.items():
        accelerator = _fresh(plugin_kwargs)
        torch.manual_seed(0)
        model = BlockNet()
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
        model, optimizer = accelerator.prepare(model, optimizer)
        _train(accelerator, model, optimizer, regression_batches(3, GLOBAL_BATCH))
        modules = [type(m).__name__ for m in model.modules()]
        out[name] = {
            "state": accelerator.get_state_dict(model),
            "checkpointed": sum(m.endswith("CheckpointWrapper") for m in modules),
            "local": local_numel(model),
            "total": num_params(BlockNet()),
            "sharding": getattr(getattr(model, "sharding_strategy", None), "name", None),
            "mesh": tuple(accelerator._strategy.device_mesh.shape),
        }
    return out


def rank_mixed_precision() -> dict:
    out = {}
    for version in (1, 2):
        accelerator = _fresh(
            {"fsdp_version": version, "auto_wrap_policy": "TRANSFORMER_BASED_WRAP"}, mixed_precision="bf16"
        )
        torch.manual_seed(0)
        model = BlockNet()
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
        model, optimizer = accelerator.prepare(model, optimizer)
        _train(accelerator, model, optimizer, regression_batches(3, GLOBAL_BATCH))
        if version == 1:
            param_dtype = model.mixed_precision.param_dtype
        else:
            param_dtype = model.blocks[0]._get_fsdp_state()._fsdp_param_group.mp_policy.param_dtype
        out[version] = {"param_dtype": str(param_dtype), "state": accelerator.get_state_dict(model)}
    accelerator = _fresh({"fsdp_version": 2}, mixed_precision="fp16", kwargs_handlers=[_scaler_kwargs()])
    torch.manual_seed(0)
    model = BlockNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    skipped = []
    for x, y in regression_batches(6, GLOBAL_BATCH):
        accelerator.backward(mse(model(x), y))
        optimizer.step()
        skipped.append(optimizer.step_was_skipped)
        optimizer.zero_grad()
    out["fp16"] = {
        "scaler": type(accelerator.scaler).__name__,
        "skipped": skipped,
        "state": accelerator.get_state_dict(model),
    }
    return out


def _scaler_kwargs():
    from accel_train import GradScalerKwargs

    return GradScalerKwargs(init_scale=2.0**40, backoff_factor=2.0**-10, growth_interval=1000)


def rank_local_checkpoint(folder: str) -> dict:
    accelerator = _fresh(
        {"fsdp_version": 1, "state_dict_type": "LOCAL_STATE_DICT", "auto_wrap_policy": "TRANSFORMER_BASED_WRAP"}
    )
    torch.manual_seed(0)
    model = BlockNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    _train(accelerator, model, optimizer, regression_batches(2, GLOBAL_BATCH))
    saved = accelerator.get_state_dict(model)
    accelerator.save_state(folder)
    with torch.no_grad():
        for param in model.parameters():
            param.zero_()
    accelerator.load_state(folder)
    loaded = accelerator.get_state_dict(model)
    return {
        "files": sorted(os.listdir(os.path.join(folder, "pytorch_model_fsdp_0"))),
        "equal": all(torch.equal(saved[k], loaded[k]) for k in saved),
    }


# -- tests ------------------------------------------------------------------------------------------


def _close(a: dict, b: dict) -> None:
    assert set(a) == set(b)
    for name in a:
        assert torch.allclose(a[name], b[name], atol=1e-5, rtol=0), name


@pytest.fixture(scope="module")
def ddp_result(dist_pool: DistributedPool) -> dict:
    return {acc: dist_pool.run(rank_train, None, True, acc)[0] for acc in (1, 2)}


@pytest.mark.parametrize(
    ("plugin_kwargs", "optimizer_first", "accumulation", "units", "sharding"),
    [
        (
            {"fsdp_version": 1, "auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "transformer_cls_names_to_wrap": "Block"},
            True,
            1,
            ["Block", "Block", "BlockNet"],
            "FULL_SHARD",
        ),
        ({"fsdp_version": 1, "sharding_strategy": "SHARD_GRAD_OP"}, False, 2, ["BlockNet"], "SHARD_GRAD_OP"),
        (
            {"fsdp_version": 2, "auto_wrap_policy": "TRANSFORMER_BASED_WRAP"},
            True,
            2,
            ["Block", "Block", "BlockNet"],
            None,
        ),
    ],
    ids=["fsdp1-full-shard-transformer-wrap", "fsdp1-shard-grad-op-accumulate", "fsdp2-no-split-modules-accumulate"],
)
def test_training_equals_ddp(
    dist_pool: DistributedPool,
    ddp_result: dict,
    plugin_kwargs: dict,
    optimizer_first: bool,
    accumulation: int,
    units: list,
    sharding: str | None,
) -> None:
    ranks = dist_pool.run(rank_train, plugin_kwargs, optimizer_first, accumulation)
    reference = ddp_result[accumulation]
    assert reference["type"] == "DistributedDataParallel"
    for facts in ranks:
        assert facts["units"] == units
        if sharding is not None:
            assert facts["sharding"] == sharding
        # Each rank holds about half of the parameters.
        assert abs(facts["local"] - facts["total"] / 2) <= 0.05 * facts["total"], facts["local"]
        _close(facts["state"], reference["state"])
        assert abs(facts["norm"] - reference["norm"]) < 1e-5
    assert ranks[0]["local"] + ranks[1]["local"] >= ranks[0]["total"]


@pytest.mark.parametrize("version", [1, 2])
def test_sharded_checkpoint_resume_and_merge(dist_pool: DistributedPool, tmp_path, version: int) -> None:
    from accel_train import merge_fsdp_weights
    from accel_train.checkpoint.file_io import load_weights

    plugin = {
        "fsdp_version": version,
        "state_dict_type": "SHARDED_STATE_DICT",
        "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
    }
    folder = str(tmp_path / "ckpt")
    uninterrupted = dist_pool.run(rank_resume, plugin, folder, None, False)
    saved = dist_pool.run(rank_resume, plugin, folder, 2, False)
    files = saved[0]["files"]
    assert {"pytorch_model_fsdp_0", "optimizer_0", "scheduler.bin", "random_states_1.safetensors"} <= set(files)
    assert "model.safetensors" not in files
    shards = sorted(os.listdir(os.path.join(folder, "pytorch_model_fsdp_0")))
    assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert sorted(os.listdir(os.path.join(folder, "optimizer_0"))) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    merged = merge_fsdp_weights(os.path.join(folder, "pytorch_model_fsdp_0"), str(tmp_path / "merged"))
    _close(load_weights(merged), saved[0]["state"])
    # save_model from the sharded model: safetensors shards and their index.
    import json

    index = json.loads((tmp_path / "ckpt_model" / "model.safetensors.index.json").read_text())
    pieces: dict = {}
    for name in sorted(set(index["weight_map"].values())):
        pieces.update(load_weights(str(tmp_path / "ckpt_model" / name)))
    assert len(set(index["weight_map"].values())) > 1
    _close(pieces, saved[0]["state"])
    resumed = dist_pool.run(rank_resume, plugin, folder, 2, True)
    for rank in range(2):
        _close(resumed[rank]["state"], uninterrupted[rank]["state"])
        assert resumed[rank]["lr"] == uninterrupted[rank]["lr"]


def test_full_state_dict_checkpoint_resume(dist_pool: DistributedPool, tmp_path) -> None:
    plugin = {"fsdp_version": 2, "state_dict_type": "FULL_STATE_DICT"}
    folder = str(tmp_path / "ckpt")
    uninterrupted = dist_pool.run(rank_resume, plugin, folder, None, False)
    saved = dist_pool.run(rank_resume, plugin, folder, 3, False)
    assert {"model.safetensors", "optimizer.bin"} <= set(saved[0]["files"])
    assert not any(name.startswith("pytorch_model_fsdp") for name in saved[0]["files"])
    resumed = dist_pool.run(rank_resume, plugin, folder, 3, True)
    _close(resumed[1]["state"], uninterrupted[1]["state"])


@pytest.mark.parametrize("version", [1, 2])
def test_cpu_ram_efficient_loading_gives_rank0_weights(dist_pool: DistributedPool, version: int) -> None:
    ranks = dist_pool.run(rank_ram_efficient, version)
    assert ranks[0]["equal"] and ranks[1]["equal"]
    assert torch.equal(ranks[0]["output"], ranks[1]["output"])


def test_sharded_checkpoint_of_other_shapes_names_the_tensors(dist_pool: DistributedPool, tmp_path) -> None:
    folder = str(tmp_path / "ckpt")
    dist_pool.run(rank_load_mismatch, folder, 8)
    messages = dist_pool.run(rank_load_mismatch, folder, 16)
    for message in messages:
        assert "tensors of another shape" in message
        assert "blocks.0.up.weight: checkpoint (16, 8), model (32, 16)" in message


def test_sharded_checkpoint_of_two_ranks_loads_in_one_process(dist_pool: DistributedPool, tmp_path) -> None:
    """DCP reshards: a checkpoint written by two processes loads where there is one."""
    plugin = {"fsdp_version": 2, "state_dict_type": "SHARDED_STATE_DICT"}
    folder = str(tmp_path / "ckpt")
    saved = dist_pool.run(rank_resume, plugin, folder, 2, False)
    accelerator = _fresh(plugin, cpu=True)
    model = BlockNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    accelerator.load_state(folder)
    _close(accelerator.get_state_dict(model), saved[0]["state"])
    assert len(optimizer.state) == len(list(model.parameters()))
    reset_shared_state()


def test_plugin_options_reach_the_model_and_train_alike(dist_pool: DistributedPool) -> None:
    ranks = dist_pool.run(rank_options)
    for facts in ranks:
        baseline = facts["fsdp2-baseline"]["state"]
        for name, case in facts.items():
            _close(case["state"], baseline)
        assert facts["fsdp1-activation-checkpointing"]["checkpointed"] == 2  # the model's _no_split_modules
        assert facts["fsdp2-activation-checkpointing-forward-prefetch"]["checkpointed"] == 2
        assert facts["fsdp1-hybrid-shard"]["sharding"] == "HYBRID_SHARD"
        assert facts["fsdp1-hybrid-shard"]["mesh"] == (1, 2)
        assert facts["fsdp1-hybrid-shard-zero2"]["sharding"] == "_HYBRID_SHARD_ZERO2"
        assert facts["fsdp1-no-shard"]["local"] == facts["fsdp1-no-shard"]["total"]
        assert facts["fsdp1-flat-parameters"]["local"] < facts["fsdp1-flat-parameters"]["total"] * 0.6


def test_mixed_precision_policies_and_sharded_scaler(dist_pool: DistributedPool) -> None:
    ranks = dist_pool.run(rank_mixed_precision)
    for facts in ranks:
        assert facts[1]["param_dtype"] == facts[2]["param_dtype"] == "torch.bfloat16"
        for name in facts[1]["state"]:
            assert facts[1]["state"][name].dtype == torch.float32
            assert torch.allclose(facts[1]["state"][name], facts[2]["state"][name], atol=2e-2), name
        assert facts["fp16"]["scaler"] == "ShardedGradScaler"
        assert facts["fp16"]["skipped"][0] is True and not all(facts["fp16"]["skipped"])
    for name, tensor in ranks[0]["fp16"]["state"].items():
        assert torch.equal(tensor, ranks[1]["fp16"]["state"][name]), name


def test_local_state_dict_checkpoint(dist_pool: DistributedPool, tmp_path) -> None:
    ranks = dist_pool.run(rank_local_checkpoint, str(tmp_path / "ckpt"))
    assert ranks[0]["files"] == ["rank0.safetensors", "rank1.safetensors"]
    assert ranks[0]["equal"] and ranks[1]["equal"]


def test_save_between_accumulation_steps_is_refused(dist_pool: DistributedPool, tmp_path) -> None:
    messages = dist_pool.run(rank_save_mid_accumulation, str(tmp_path / "ckpt"))
    assert all(
        "between two optimizer steps of gradient accumulation is not supported with FSDP1" in m for m in messages
    )
    assert not (tmp_path / "ckpt").exists()
