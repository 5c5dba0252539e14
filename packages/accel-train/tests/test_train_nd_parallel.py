"""ND parallelism: the mesh of a ParallelismConfig, tensor-parallel plans, and the strategy on 2 and 4
real gloo processes (tp=2; dp_shard=2 x tp=2; HSDP dp_replicate=2 x dp_shard=2) against dense runs."""

from __future__ import annotations

import pytest
import torch

from accel_state.testing import DistributedPool, reset_shared_state
from accel_train.parallelism_config import ParallelismConfig, TorchTensorParallelConfig
from accel_train.tensor_parallel import model_plan, resolve_plan

# -- a small block model with a plan --------------------------------------------------------------------


class Block(torch.nn.Module):
    def __init__(self, width: int = 8, hidden: int = 16) -> None:
        super().__init__()
        self.up = torch.nn.Linear(width, hidden)
        self.down = torch.nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class BlockNet(torch.nn.Module):
    tp_plan = {"blocks.*.up": "colwise", "blocks.*.down": "rowwise"}

    def __init__(self, depth: int = 2) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(4, 8)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(depth))
        self.out = torch.nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.out(x)


def _data(n: int = 64) -> torch.utils.data.TensorDataset:
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(n, 4, generator=generator)
    return torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True).sin())


def _dense_run(global_batch: int, steps: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = BlockNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    x, y = _data().tensors
    losses = []
    for step in range(steps):
        window = slice(step * global_batch, (step + 1) * global_batch)
        loss = torch.nn.functional.mse_loss(model(x[window]), y[window])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


# -- pure logic -----------------------------------------------------------------------------------------


def test_dimension_names_follow_the_sizes() -> None:
    config = ParallelismConfig(dp_replicate_size=2, dp_shard_size=2, tp_size=2)
    assert config.active_mesh_dims == ["dp_replicate", "dp_shard", "tp"]
    assert config.dp_dim_names == ["dp_replicate", "dp_shard"] and config.non_dp_dim_names == ["tp"]
    assert config.fsdp_dim_names == ["dp_replicate", "dp_shard"]
    with_cp = ParallelismConfig(dp_shard_size=2, cp_size=2)
    assert with_cp.dp_shard_cp_dim_names == ["dp_shard", "cp"] and with_cp.fsdp_dim_names == ["dp_shard_cp"]
    assert ParallelismConfig(tp_size=2).fsdp_dim_names == []
    assert ParallelismConfig(dp_replicate_size=4).is_trivial and not ParallelismConfig(tp_size=2).is_trivial


@pytest.mark.parametrize(
    "size", ["dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "sp_size", "pp_size", "ep_size"]
)
def test_each_size_left_unset_reads_its_declared_variable(size: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from accel_state import env_vars

    variable = f"PARALLELISM_CONFIG_{size.upper()}"
    row = env_vars.spec(variable)  # the launcher writes what this row declares
    assert (row.type, row.default) == ("int", 1)
    assert getattr(ParallelismConfig(), size) == 1
    monkeypatch.setenv(variable, "2")
    assert getattr(ParallelismConfig(), size) == 2
    assert getattr(ParallelismConfig(**{size: 1}), size) == 1  # an argument wins over the variable
    monkeypatch.setenv(variable, "two")
    with pytest.raises(ValueError, match=variable):
        ParallelismConfig()


def test_sizes_must_multiply_to_the_world_size() -> None:
    config = ParallelismConfig(dp_shard_size=2, tp_size=2)
    config.validate_world_size(4)
    with pytest.raises(
        ValueError, match=r"multiply to 4 \(dp_replicate 1 x dp_shard 2 x tp 2 x cp 1 x sp 1\).*2 processes"
    ):
        config.validate_world_size(2)


def test_plans_resolve_against_the_model() -> None:
    model = BlockNet()
    plan = resolve_plan(model, model_plan(model), tp_size=2)
    assert plan == {
        "blocks.0.up": "colwise",
        "blocks.1.up": "colwise",
        "blocks.0.down": "rowwise",
        "blocks.1.down": "rowwise",
    }
    explicit = model_plan(model, TorchTensorParallelConfig(tp_plan={"out": "colwise_rep"}).tp_plan)
    assert explicit == {"out": "colwise_rep"}


@pytest.mark.parametrize(
    ("plan", "tp", "message"),
    [
        (None, 2, "tensor parallelism \\(tp_size=2\\) needs a plan for Linear"),
        ({"decoder.*.q": "colwise"}, 2, "'decoder.\\*.q' matches no module"),
        ({"": "diagonal"}, 2, "'diagonal' is not a known style"),
        ({"weight_only": "colwise"}, 3, "matches no module"),
    ],
)
def test_bad_plans_say_what_to_change(plan, tp: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        resolve_plan(torch.nn.Linear(4, 4), plan, tp)


def test_a_split_that_does_not_divide_is_refused() -> None:
    with pytest.raises(ValueError, match="blocks.0.up has 16 output features.*tp_size=3"):
        resolve_plan(BlockNet(), {"blocks.*.up": "colwise"}, tp_size=3)


# -- on real processes ----------------------------------------------------------------------------------


def _accelerator(**sizes):
    reset_shared_state()
    from accel_train import Accelerator

    return Accelerator(parallelism_config=ParallelismConfig(**sizes))


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def rank_tp_forward_backward() -> dict:
    accelerator = _accelerator(tp_size=2)
    torch.manual_seed(0)
    model = BlockNet()
    dense = BlockNet()
    dense.load_state_dict(model.state_dict())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(_data(), batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    x, y = next(iter(loader))
    out = model(x)
    torch.nn.functional.mse_loss(out, y).backward()
    ref = dense(x)
    torch.nn.functional.mse_loss(ref, y).backward()
    dense_params = dict(dense.named_parameters())
    grad_diff = max((_full(p.grad) - dense_params[n].grad).abs().max().item() for n, p in model.named_parameters())
    return {
        "out_diff": (out - ref).abs().max().item(),
        "grad_diff": grad_diff,
        "batch": x,
        "up_type": type(model.blocks[0].up.weight).__name__,
        "local_up_rows": model.blocks[0].up.weight.to_local().shape[0],
        "tp_rank": accelerator.tensor_parallel_rank,
        "dp_rank": accelerator.data_parallel_rank,
        "mesh": accelerator.torch_device_mesh.mesh_dim_names,
        "optimizer_on_model_params": [id(p) for g in optimizer.param_groups for p in g["params"]]
        == [id(p) for p in model.parameters()],
    }


def test_tp2_equals_the_dense_model_and_peers_share_batches(dist_pool: DistributedPool) -> None:
    results = dist_pool.run(rank_tp_forward_backward)
    for result in results:
        assert result["out_diff"] < 1e-5 and result["grad_diff"] < 1e-5
        assert result["up_type"] == "DTensor" and result["local_up_rows"] == 8
        assert result["optimizer_on_model_params"] and result["mesh"] == ("tp",)
        assert result["dp_rank"] == 0
    assert [r["tp_rank"] for r in results] == [0, 1]
    assert torch.equal(results[0]["batch"], results[1]["batch"])


def rank_train(sizes: dict, steps: int, per_rank_batch: int, save_at: int | None, folder: str | None) -> dict:
    accelerator = _accelerator(**sizes)
    torch.manual_seed(0)
    model = BlockNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(_data(), batch_size=per_rank_batch)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses, first_batches = [], []
    for step, (x, y) in enumerate(loader):
        if step == steps:
            break
        if save_at is not None and step == save_at:
            accelerator.save_state(folder)
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 100.0)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(accelerator.reduce(loss.detach(), "mean").item())
        if step == 0:
            first_batches.append(x)
    state = accelerator.get_state_dict(model)
    # the flattened data-parallel rank: dp_replicate rank x dp_shard size + dp_shard rank
    dp = accelerator.data_parallel_rank * sizes.get("dp_shard_size", 1) + accelerator.data_parallel_shard_rank
    return {"losses": losses, "state": state, "first": first_batches[0], "dp": dp}


@pytest.mark.parametrize(
    "sizes",
    [{"dp_shard_size": 2, "tp_size": 2}, {"dp_replicate_size": 2, "dp_shard_size": 2}],
    ids=["dp_shard2xtp2", "hsdp2x2"],
)
def test_four_processes_train_like_the_dense_model(pool4: DistributedPool, sizes: dict) -> None:
    steps, per_rank = 3, 4
    results = pool4.run(rank_train, sizes, steps, per_rank, None, None)
    dp_size = sizes.get("dp_replicate_size", 1) * sizes.get("dp_shard_size", 1)
    dense_losses, dense_state = _dense_run(per_rank * dp_size, steps)
    for result in results:
        assert result["losses"] == pytest.approx(dense_losses, abs=1e-4)
    full = results[0]["state"]
    assert set(full) == set(dense_state)
    assert all(torch.equal(r["state"][k], full[k]) for r in results[1:] for k in full)
    for key, value in dense_state.items():
        assert torch.allclose(full[key], value, atol=1e-4), key
    by_dp: dict[int, list[torch.Tensor]] = {}
    for result in results:
        by_dp.setdefault(result["dp"], []).append(result["first"])
    assert sorted(by_dp) == list(range(dp_size))
    for batches in by_dp.values():  # peers of one data-parallel rank see the same batch
        assert all(torch.equal(batches[0], b) for b in batches)
    firsts = [batches[0] for batches in by_dp.values()]
    assert not torch.equal(firsts[0], firsts[1])  # data-parallel ranks see different batches


def rank_resume(folder: str) -> list[float]:
    first = rank_train({"tp_size": 2}, 4, 4, save_at=2, folder=folder)
    accelerator = _accelerator(tp_size=2)
    torch.manual_seed(123)  # a different start: everything must come from the checkpoint
    model = BlockNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(_data(), batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    accelerator.load_state(folder)
    losses = []
    for step, (x, y) in enumerate(accelerator.skip_first_batches(loader, 2)):
        if step == 2:
            break
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 100.0)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return [first["losses"][2:], losses]


def test_tp_checkpoint_resumes_exactly(dist_pool: DistributedPool, tmp_path) -> None:
    results = dist_pool.run(rank_resume, str(tmp_path / "ckpt"))
    for uninterrupted, resumed in results:
        assert resumed == pytest.approx(uninterrupted, abs=1e-6)
    import os

    entries = sorted(os.listdir(tmp_path / "ckpt"))
    assert "pytorch_model_fsdp_0" in entries and "optimizer_0" in entries


def rank_bad_sizes() -> str:
    try:
        _accelerator(tp_size=4)
    except ValueError as error:
        return str(error)
    return "no error"


def test_sizes_that_do_not_fit_the_world_are_an_error(dist_pool: DistributedPool) -> None:
    for message in dist_pool.run(rank_bad_sizes):
        assert "multiply to 4" in message and "the run has 2 processes" in message


def rank_cp_on_cpu() -> str:
    try:
        _accelerator(cp_size=2)
    except NotImplementedError as error:
        return str(error)
    return "no error"


def test_context_parallel_on_cpu_says_it_needs_cuda(dist_pool: DistributedPool) -> None:
    for message in dist_pool.run(rank_cp_on_cpu):
        assert "cp_size=2" in message and "CUDA only" in message and "set cp_size=1" in message


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="context parallelism runs on CUDA only; needs 2 GPUs")
def test_context_parallel_attention_equals_full_attention_on_gpus() -> None:  # pragma: no cover - GPU only
    from accel_state.testing import run_distributed

    results = run_distributed(rank_cp_attention, world_size=2, env={"ACCELERATE_USE_CPU": "false"})
    assert all(diff < 1e-3 for diff in results)


def rank_cp_attention() -> float:  # pragma: no cover - GPU only
    accelerator = _accelerator(cp_size=2)
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 16, 8, device=accelerator.device) for _ in range(3))
    full = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    rank = accelerator.context_parallel_rank
    with accelerator.maybe_context_parallel(buffers=[q, k, v], buffer_seq_dims=[2, 2, 2], no_restore_buffers={q, k, v}):
        local = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    # torch's load-balanced layout: each rank holds chunks i and 2n-1-i of the sequence
    chunks = full.chunk(4, dim=2)
    expected = torch.cat([chunks[rank], chunks[3 - rank]], dim=2)
    return (local - expected).abs().max().item()


def test_the_optimizer_follows_replaced_parameters_with_its_state() -> None:
    from accel_train.strategies.base import parameter_locations, rebind_optimizer_parameters

    models = [torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.Linear(2, 1))]
    optimizer = torch.optim.Adam(
        [{"params": list(models[0].parameters())}, {"params": list(models[1].parameters()), "lr": 0.5}]
    )
    models[0](torch.ones(1, 2)).sum().backward()
    models[1](torch.ones(1, 2)).sum().backward()
    optimizer.step()  # state for every parameter
    saved = {name: optimizer.state[p]["exp_avg"] for name, p in models[0].named_parameters()}
    locations = parameter_locations(models, lambda name: f"x.{name}")
    assert locations[id(models[1][0].weight)] == (1, "x.0.weight")
    new_params = [
        {f"x.{name}": torch.nn.Parameter(p.detach().clone()) for name, p in m.named_parameters()} for m in models
    ]
    rebind_optimizer_parameters(optimizer, locations, new_params)
    expected = [
        [new_params[0]["x.weight"], new_params[0]["x.bias"]],
        [new_params[1]["x.0.weight"], new_params[1]["x.0.bias"]],
    ]
    for group, params in zip(optimizer.param_groups, expected):
        assert len(group["params"]) == 2 and all(a is b for a, b in zip(group["params"], params))
    assert optimizer.param_groups[1]["lr"] == 0.5
    assert optimizer.state[new_params[0]["x.weight"]]["exp_avg"] is saved["weight"]
    assert len(optimizer.state) == 4  # nothing left under the old parameters
