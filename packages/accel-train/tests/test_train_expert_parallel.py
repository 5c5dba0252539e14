"""Expert parallelism (``ParallelismConfig(ep_size=...)``): the settings in-process, then real gloo
processes — a user-defined mixture-of-experts block and transformers' Qwen3-MoE train 8 steps with
``ep_size=2`` (2 processes) and ``dp_shard=2 x ep_size=2`` (4 processes) like one process on the whole
batch, each process holding only its experts; checkpoints resume exactly and reshard to another
``ep_size``; a router that sends every token to one expert still runs; bad input is refused by name."""

from __future__ import annotations

import os

import pytest
import torch
from cpu_backends import StackedExperts  # a user's expert module of the documented contract
from fsdp_helpers import mse

from accel_state.testing import DistributedPool, DistributedTestFailure, reset_shared_state
from accel_train.parallelism_config import ParallelismConfig
from accel_train.strategies.base import ParallelDims

STEPS = 8

# -- models ---------------------------------------------------------------------------------------------


class ListedExperts(torch.nn.Module):
    """A user's expert module holding its experts as a list of small MLPs."""

    def __init__(self, num_experts: int = 4, width: int = 8) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.experts = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(width, 12), torch.nn.ReLU(), torch.nn.Linear(12, width))
            for _ in range(num_experts)
        )

    def forward(self, hidden_states, top_k_index, top_k_weights):
        out = torch.zeros_like(hidden_states)
        for expert in range(self.num_experts):
            token, choice = torch.where(top_k_index == expert)
            if token.numel():  # an expert without tokens is skipped, as transformers' loops do
                out.index_add_(
                    0, token, self.experts[expert](hidden_states[token]) * top_k_weights[token, choice, None]
                )
        return out


class MoEBlock(torch.nn.Module):
    """A router and an expert module; ``force`` sends every token to one expert."""

    def __init__(self, num_experts: int = 4, listed: bool = False, force: int | None = None) -> None:
        super().__init__()
        self.router = torch.nn.Linear(8, num_experts, bias=False)
        self.experts = ListedExperts(num_experts) if listed else StackedExperts(num_experts, 8, 12)
        self.force = force

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        weights, index = torch.topk(torch.softmax(self.router(flat), dim=-1), 2, dim=-1)
        if self.force is not None:
            index = torch.full_like(index, self.force)
        return x + self.experts(flat, index, weights).reshape(x.shape)


class MoENet(torch.nn.Module):
    def __init__(self, num_experts: int = 4, listed: bool = False, force: int | None = None) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(4, 8)
        self.blocks = torch.nn.ModuleList(MoEBlock(num_experts, listed, force) for _ in range(2))
        self.out = torch.nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.out(x)


class DenseNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


def _qwen3_moe() -> torch.nn.Module:
    import transformers

    config = transformers.Qwen3MoeConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        moe_intermediate_size=8,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        num_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=64,
    )
    return transformers.Qwen3MoeForCausalLM(config)


def _build(kind: str, **options) -> torch.nn.Module:
    torch.manual_seed(0)
    return {"block": MoENet, "qwen3_moe": _qwen3_moe, "dense": DenseNet}[kind](**options)


def _batches(kind: str) -> torch.utils.data.Dataset:
    generator = torch.Generator().manual_seed(3)
    if kind == "qwen3_moe":
        return torch.randint(0, 64, (64, 8), generator=generator)  # type: ignore[return-value]
    x = torch.randn(128, 4, generator=generator)
    return torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True).sin())


def _loss(kind: str, model: torch.nn.Module, batch) -> torch.Tensor:
    if kind == "qwen3_moe":
        return model(input_ids=batch, labels=batch).loss
    x, y = batch
    return mse(model(x), y)  # float32 (torch 2.9's CPU mse_loss backward fails on bf16 vs float32)


def _optimizer(kind: str, model: torch.nn.Module) -> torch.optim.Optimizer:
    # Adam divides by the root of the squared gradient: in a transformer, where some gradients are
    # nearly zero, a 1e-8 difference of summation order (which plain FSDP data parallelism has too) moves
    # a weight by up to lr. SGD keeps what is compared the arithmetic of the layout.
    if kind == "qwen3_moe":
        return torch.optim.SGD(model.parameters(), lr=0.1)
    return torch.optim.AdamW(model.parameters(), lr=0.01)


def _one_process(kind: str, global_batch: int, **options) -> tuple[list[float], dict[str, torch.Tensor]]:
    model = _build(kind, **options)
    optimizer = _optimizer(kind, model)
    data = _batches(kind)
    losses = []
    for step in range(STEPS):
        if kind == "qwen3_moe":
            batch = data[step * global_batch : (step + 1) * global_batch]
        else:
            batch = tuple(t[step * global_batch : (step + 1) * global_batch] for t in data.tensors)
        loss = _loss(kind, model, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


# -- pure logic -----------------------------------------------------------------------------------------


def test_the_expert_dimension_is_one_more_data_parallel_factor() -> None:
    config = ParallelismConfig(dp_shard_size=2, ep_size=2)
    assert config.active_mesh_dims == ["dp_shard", "ep"] and not config.is_trivial and config.ep_enabled
    assert config.total_size == 4 and config.data_parallel_size == 4
    assert config.dp_dim_names == ["dp_shard", "ep"] and config.expert_dp_dim_names == ["dp_shard"]
    assert config.fsdp_dim_names == ["dp_shard_cp"]  # the layers that are not experts shard over dp_shard x ep
    assert ParallelismConfig(ep_size=2).fsdp_dim_names == ["ep"]
    assert ParallelismConfig(ep_size=2).expert_dp_dim_names == []
    config.validate_world_size(4)
    with pytest.raises(ValueError, match=r"multiply to 4 \(.*ep 2\) but the run has 2 processes"):
        config.validate_world_size(2)


def test_the_data_parallel_rank_counts_the_expert_rank_innermost() -> None:
    dims = ParallelDims(dp_shard_size=2, ep_size=2, dp_shard_rank=1, ep_rank=1)
    assert (dims.data_parallel_size, dims.data_parallel_rank, dims.world_size) == (4, 3, 4)
    with pytest.raises(ValueError, match=r"ep_rank must be in \[0, 2\)"):
        ParallelDims(ep_size=2, ep_rank=2)


@pytest.mark.parametrize(
    ("sizes", "named"),
    [
        ({"tp_size": 2}, "tp_size"),
        ({"cp_size": 2}, "cp_size"),
        ({"pp_size": 2}, "pp_size"),
        ({"sp_size": 2}, "sp_size"),
    ],
)
def test_combinations_not_built_yet_are_refused_by_name(sizes: dict, named: str) -> None:
    with pytest.raises(ValueError, match=rf"ep_size=2.*{named}=2 is not supported.*set {named} to 1"):
        ParallelismConfig(ep_size=2, **sizes)


@pytest.mark.parametrize("value", [0, -1, 1.5, "2", True])
def test_a_bad_ep_size_is_refused(value) -> None:
    with pytest.raises(ValueError, match=rf"ParallelismConfig.ep_size must be an int >= 1, got {value!r}"):
        ParallelismConfig(ep_size=value)


def test_the_launcher_size_is_read(monkeypatch) -> None:
    monkeypatch.setenv("PARALLELISM_CONFIG_EP_SIZE", "4")
    assert ParallelismConfig().ep_size == 4
    assert ParallelismConfig(ep_size=2).ep_size == 2  # the script's value wins


def test_fsdp2_units_are_the_outer_blocks_not_the_listed_experts_inside() -> None:
    from accel_train.strategies.fsdp.fsdp2 import shard_units

    model = MoENet(listed=True)
    # the experts' list repeats one class too, but an expert a rank's tokens miss is not called there:
    # as a unit of its own its all-gather would run on some ranks only
    assert shard_units(model, None, default_blocks=True) == list(model.blocks)


# -- on real processes ----------------------------------------------------------------------------------


def _accelerator(sizes: dict):
    reset_shared_state()
    from accel_train import Accelerator

    return Accelerator(parallelism_config=ParallelismConfig(**sizes))


def _local_numel(tensor: torch.Tensor) -> int:
    return tensor.to_local().numel() if hasattr(tensor, "to_local") else tensor.numel()


def rank_train(kind: str, sizes: dict, per_rank: int, options: dict, resume: dict | None = None) -> dict:
    """Train STEPS steps; ``resume`` = {"folder", "save_at"} saves there at that step (and returns the
    losses after it), or {"folder", "load": True, "skip"} loads it and trains the remaining steps."""
    accelerator = _accelerator(sizes)
    model = _build(kind, **options)
    if resume and resume.get("load"):
        torch.manual_seed(123)  # a different start: everything must come from the checkpoint
        model = _build(kind, **options)
        with torch.no_grad():
            for param in model.parameters():
                param.add_(1.0)
    optimizer = _optimizer(kind, model)
    loader = torch.utils.data.DataLoader(_batches(kind), batch_size=per_rank)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    start = 0
    if resume and resume.get("load"):
        accelerator.load_state(resume["folder"])
        start = resume["skip"]
        loader = accelerator.skip_first_batches(loader, start)
    losses, counts = [], []
    for step, batch in enumerate(loader, start=start):
        if step == STEPS:
            break
        if resume and step == resume.get("save_at"):
            accelerator.save_state(resume["folder"])
        loss = _loss(kind, model, batch)
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 100.0)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(accelerator.reduce(loss.detach(), "mean").item())
        counts.append({name: c.clone() for name, c in accelerator.expert_token_counts.items()})
    expert_names = {n for n, p in model.named_parameters() if "experts" in n}
    return {
        "losses": losses,
        "state": accelerator.get_state_dict(model),
        "local_expert_numel": sum(_local_numel(p) for n, p in model.named_parameters() if n in expert_names),
        "counts": counts,
        "ep_rank": accelerator.expert_parallel_rank,
        "dp_shard_rank": accelerator.data_parallel_shard_rank,
    }


def _compare(results: list[dict], kind: str, world: int, per_rank: int, **options) -> dict[str, torch.Tensor]:
    losses, state = _one_process(kind, per_rank * world, **options)
    for result in results:
        assert result["losses"] == pytest.approx(losses, abs=1e-5)
    full = results[0]["state"]
    assert set(full) == set(state)
    for key, value in state.items():
        assert full[key].shape == value.shape, key  # the ordinary layout: [num_experts, ...]
        assert torch.allclose(full[key], value, atol=1e-5), (key, (full[key] - value).abs().max())
    return state


def _expert_numel(state: dict[str, torch.Tensor]) -> int:
    return sum(v.numel() for k, v in state.items() if "experts" in k)


def test_a_user_block_trains_like_one_process_with_ep2(dist_pool: DistributedPool) -> None:
    results = dist_pool.run(rank_train, "block", {"ep_size": 2}, 4, {})
    state = _compare(results, "block", 2, 4)
    assert [r["ep_rank"] for r in results] == [0, 1]
    for result in results:  # each process holds half of the experts
        assert result["local_expert_numel"] * 2 == _expert_numel(state)
        for step in result["counts"]:  # 4 samples x 2 choices routed by each of the two blocks
            assert set(step) == {"blocks.0.experts", "blocks.1.experts"}
            assert all(int(c.sum()) == 8 and c.shape == (4,) for c in step.values())


def test_a_transformers_moe_model_trains_like_one_process_with_ep2(dist_pool: DistributedPool) -> None:
    pytest.importorskip("transformers")
    results = dist_pool.run(rank_train, "qwen3_moe", {"ep_size": 2}, 2, {})
    state = _compare(results, "qwen3_moe", 2, 2)
    for result in results:
        assert result["local_expert_numel"] * 2 == _expert_numel(state)
        assert all(int(c.sum()) == 2 * 8 * 2 for step in result["counts"] for c in step.values())


def test_a_router_sending_every_token_to_one_expert_still_runs(dist_pool: DistributedPool) -> None:
    results = dist_pool.run(rank_train, "block", {"ep_size": 2}, 4, {"force": 3})
    _compare(results, "block", 2, 4, force=3)
    for result in results:  # expert 3 lives on ep rank 1: rank 0's experts receive nothing
        assert all(c.tolist() == [0, 0, 0, 8] for step in result["counts"] for c in step.values())


def test_listed_experts_train_like_one_process_and_save_whole(dist_pool: DistributedPool) -> None:
    results = dist_pool.run(rank_train, "block", {"ep_size": 2}, 4, {"listed": True})
    state = _compare(results, "block", 2, 4, listed=True)  # get_state_dict gathered every expert
    for result in results:  # each process holds 2 of the 4 listed experts of each block
        assert result["local_expert_numel"] * 2 == _expert_numel(state)
    assert list(results[0]["state"]) == list(state)  # in the unsplit model's order


def test_four_processes_dp_shard2_x_ep2_train_like_one_process(pool4: DistributedPool) -> None:
    pytest.importorskip("transformers")
    results = pool4.run(rank_train, "qwen3_moe", {"dp_shard_size": 2, "ep_size": 2}, 2, {})
    state = _compare(results, "qwen3_moe", 4, 2)
    for result in results:  # half of the experts per ep rank, sharded again over dp_shard
        assert result["local_expert_numel"] * 4 == _expert_numel(state)
    assert sorted((r["dp_shard_rank"], r["ep_rank"]) for r in results) == [(0, 0), (0, 1), (1, 0), (1, 1)]


def test_a_checkpoint_resumes_exactly_and_reshards_to_another_ep_size(dist_pool: DistributedPool, tmp_path) -> None:
    folder = str(tmp_path / "ckpt")
    first = dist_pool.run(rank_train, "block", {"ep_size": 2}, 4, {}, {"folder": folder, "save_at": 4})
    same = dist_pool.run(rank_train, "block", {"ep_size": 2}, 4, {}, {"folder": folder, "load": True, "skip": 4})
    for uninterrupted, resumed in zip(first, same):
        assert resumed["losses"] == pytest.approx(uninterrupted["losses"][4:], abs=1e-6)
    # the same checkpoint into plain sharded data parallelism: the experts gathered from both processes
    other = dist_pool.run(rank_train, "block", {"dp_shard_size": 2}, 4, {}, {"folder": folder, "load": True, "skip": 4})
    for uninterrupted, resumed in zip(first, other):
        assert resumed["losses"] == pytest.approx(uninterrupted["losses"][4:], abs=1e-5)
    assert "pytorch_model_fsdp_0" in os.listdir(folder)


def test_a_dp_shard2_x_ep2_checkpoint_resumes_with_ep4(pool4: DistributedPool, tmp_path) -> None:
    folder = str(tmp_path / "ckpt")
    first = pool4.run(rank_train, "block", {"dp_shard_size": 2, "ep_size": 2}, 4, {}, {"folder": folder, "save_at": 4})
    other = pool4.run(rank_train, "block", {"ep_size": 4}, 4, {}, {"folder": folder, "load": True, "skip": 4})
    for uninterrupted, resumed in zip(first, other):  # experts sharded 2-D (dp_shard, ep) read back over ep
        assert resumed["losses"] == pytest.approx(uninterrupted["losses"][4:], abs=1e-5)
        assert resumed["local_expert_numel"] == uninterrupted["local_expert_numel"]  # a quarter each, both ways


def test_a_checkpoint_of_listed_experts_resumes_and_reshards(dist_pool: DistributedPool, tmp_path) -> None:
    folder, listed = str(tmp_path / "ckpt"), {"listed": True}
    first = dist_pool.run(rank_train, "block", {"ep_size": 2}, 4, listed, {"folder": folder, "save_at": 4})
    same = dist_pool.run(rank_train, "block", {"ep_size": 2}, 4, listed, {"folder": folder, "load": True, "skip": 4})
    other = dist_pool.run(
        rank_train, "block", {"dp_shard_size": 2}, 4, listed, {"folder": folder, "load": True, "skip": 4}
    )
    for uninterrupted, resumed, resharded in zip(first, same, other):
        assert resumed["losses"] == pytest.approx(uninterrupted["losses"][4:], abs=1e-6)
        assert resharded["losses"] == pytest.approx(uninterrupted["losses"][4:], abs=1e-5)


def rank_precision(mixed_precision: str) -> tuple[list[float], str]:
    reset_shared_state()
    from accel_train import Accelerator

    accelerator = Accelerator(parallelism_config=ParallelismConfig(ep_size=2), mixed_precision=mixed_precision)
    model = _build("block")
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(_batches("block"), batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for step, batch in enumerate(loader):
        if step == 4:
            break
        loss = _loss("block", model, batch)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(accelerator.reduce(loss.detach().float(), "mean").item())
    return losses, str(model.blocks[0].experts.up.dtype)


def test_bf16_trains_near_float32_with_float32_expert_weights(dist_pool: DistributedPool) -> None:
    full = dist_pool.run(rank_precision, "no")[0][0]
    for losses, dtype in dist_pool.run(rank_precision, "bf16"):
        assert losses == pytest.approx(full, abs=0.05) and losses != full  # computed in bf16, close
        assert dtype == "torch.float32"  # the weights the optimizer updates stay float32


def rank_save_model(folder: str, options: dict) -> list[str]:
    from safetensors.torch import load_file

    accelerator = _accelerator({"ep_size": 2})
    model = accelerator.prepare(_build("block", **options))
    accelerator.save_model(model, folder)
    accelerator.save_state(folder + "-state")  # for merge-weights
    accelerator.wait_for_everyone()
    files = sorted(os.listdir(folder))
    loaded = load_file(os.path.join(folder, "model.safetensors"))
    return [files, {k: tuple(v.shape) for k, v in loaded.items() if "experts" in k}]


def test_save_model_writes_the_experts_in_the_ordinary_layout(dist_pool: DistributedPool, tmp_path) -> None:
    results = dist_pool.run(rank_save_model, str(tmp_path / "model"), {})
    files, shapes = results[0]
    assert files == ["model.safetensors"]
    assert shapes == {
        f"blocks.{i}.experts.{n}": s for i in (0, 1) for n, s in (("up", (4, 12, 8)), ("down", (4, 8, 12)))
    }
    files, shapes = dist_pool.run(rank_save_model, str(tmp_path / "listed"), {"listed": True})[0]
    expected = {"0.weight": (12, 8), "0.bias": (12,), "2.weight": (8, 12), "2.bias": (8,)}
    from safetensors.torch import load_file

    from accel_train.checkpoint.merge import merge_fsdp_weights

    for name in ("model", "listed"):  # merge-weights of the sharded checkpoint gives what save_model wrote
        merge_fsdp_weights(str(tmp_path / f"{name}-state" / "pytorch_model_fsdp_0"), str(tmp_path / f"{name}-merged"))
        merged = load_file(str(tmp_path / f"{name}-merged" / "model.safetensors"))
        saved = load_file(str(tmp_path / name / "model.safetensors"))
        assert set(merged) == set(saved) and all(torch.equal(merged[k], saved[k]) for k in saved)
    assert shapes == {
        f"blocks.{i}.experts.experts.{e}.{n}": s for i in (0, 1) for e in range(4) for n, s in expected.items()
    }


def rank_listed_on_old_torch() -> str:
    from torch.distributed.fsdp import FSDPModule

    kept = getattr(FSDPModule, "set_reduce_scatter_unused_params", None)
    if kept is not None:
        del FSDPModule.set_reduce_scatter_unused_params  # as in torch 2.9: absent
    try:
        accelerator = _accelerator({"dp_shard_size": 2})
        try:
            accelerator.prepare(_build("block", listed=True))
        except NotImplementedError as error:
            return str(error)
        return "prepared"
    finally:
        if kept is not None:
            FSDPModule.set_reduce_scatter_unused_params = kept


def test_listed_experts_over_dp_shard_are_refused_by_name_where_torch_cannot_reduce_unused(
    dist_pool: DistributedPool,
) -> None:
    for message in dist_pool.run(rank_listed_on_old_torch):
        assert "('blocks.0.experts') over dp_shard needs FSDP2's set_reduce_scatter_unused_params" in message


def rank_refused(kind: str, options: dict) -> None:
    accelerator = _accelerator({"ep_size": 2})
    accelerator.prepare(_build(kind, **options))


@pytest.mark.parametrize(
    ("kind", "options", "message"),
    [
        ("block", {"num_experts": 3}, r"ep_size=2\) does not divide the 3 experts of 'blocks.0.experts'"),
        ("dense", {}, r"needs a mixture-of-experts model, but DenseNet has no expert module"),
    ],
    ids=["indivisible", "no-experts"],
)
def test_bad_models_are_refused_by_name(dist_pool: DistributedPool, kind: str, options: dict, message: str) -> None:
    with pytest.raises(DistributedTestFailure, match=message):
        dist_pool.run(rank_refused, kind, options)
