"""The Accelerator on two real gloo processes: DDP, accumulation, collectives, hooks, checkpoints."""

from __future__ import annotations

import os

import pytest
import torch
from train_helpers import TinyNet, flat_params, regression_dataset

from accel_state.testing import DistributedPool, reset_shared_state


def _fresh(**kwargs):
    reset_shared_state()
    from accel_train import Accelerator

    return Accelerator(**kwargs)


# -- rank functions (module level: DistributedPool runs them by name) -------------------------------


def rank_ddp_training(accumulation: int, batch: int) -> dict:
    accelerator = _fresh(gradient_accumulation_steps=accumulation)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = torch.utils.data.DataLoader(regression_dataset(48), batch_size=batch)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    grads_at_non_sync = []
    syncs = []
    for x, y in loader:
        with accelerator.accumulate(model):
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            syncs.append(accelerator.sync_gradients)
            if not accelerator.sync_gradients:
                grads_at_non_sync.append(model.module.weight.grad.clone())
            optimizer.step()
            optimizer.zero_grad()
    return {
        "wrapped": type(model).__name__,
        "params": flat_params(accelerator.unwrap_model(model)),
        "syncs": syncs,
        "non_sync_grads": grads_at_non_sync,
    }


def rank_scheduler_and_sync_each_batch() -> dict:
    from accel_train import GradientAccumulationPlugin

    accelerator = _fresh(gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=2, sync_each_batch=True))
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    grads = []
    for step in range(4):
        with accelerator.accumulate(model):
            x = torch.full((2, 4), float(accelerator.process_index + step + 1))
            accelerator.backward(model(x).sum())
            if not accelerator.sync_gradients:
                grads.append(model.module.weight.grad.clone())
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
    return {"grads": grads, "lr": scheduler.get_last_lr()[0]}


def rank_collectives() -> dict:
    accelerator = _fresh()
    rank = accelerator.process_index
    out: dict = {}
    out["gather"] = accelerator.gather(torch.tensor([rank, rank + 10])).tolist()
    out["gather_nested"] = accelerator.gather({"a": torch.tensor([rank])})["a"].tolist()
    out["reduce_sum"] = accelerator.reduce(torch.tensor([1.0 + rank]), "sum").tolist()
    out["reduce_mean"] = accelerator.reduce(torch.tensor([1.0 + rank]), "mean").tolist()
    out["pad"] = accelerator.pad_across_processes(torch.arange(rank + 1), pad_index=-1).tolist()
    out["pad_first"] = accelerator.pad_across_processes(torch.arange(rank + 1), pad_first=True).tolist()
    with accelerator.split_between_processes(["a", "b", "c"], apply_padding=True) as share:
        out["split"] = share
    out["objects"] = accelerator.gather_for_metrics([f"r{rank}"])
    if rank == 1:
        accelerator.set_trigger()
    out["trigger"] = accelerator.check_trigger()
    out["trigger_reset"] = accelerator.check_trigger()
    called = []
    accelerator.on_main_process(lambda: called.append("main"))()
    accelerator.on_local_process(lambda: called.append("local1"), local_process_index=1)()
    out["called"] = called
    return out


def rank_gather_for_metrics(length: int, batch: int) -> dict:
    accelerator = _fresh()
    loader = accelerator.prepare(torch.utils.data.DataLoader(torch.arange(length), batch_size=batch))
    gathered, objects = [], []
    for values in loader:
        gathered.append(accelerator.gather_for_metrics(values))
        objects.extend(accelerator.gather_for_metrics(values.tolist(), use_gather_object=True))
    return {"tensors": torch.cat(gathered).tolist(), "objects": objects}


def rank_comm_hook(hook: str, wrapper: str, options: dict) -> torch.Tensor:
    from accel_train import DistributedDataParallelKwargs

    handlers = (
        []
        if hook == "none"
        else [DistributedDataParallelKwargs(comm_hook=hook, comm_wrapper=wrapper, comm_state_option=options)]
    )
    accelerator = _fresh(kwargs_handlers=handlers)
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    generator = torch.Generator().manual_seed(accelerator.process_index)
    for _ in range(3):
        x = torch.randn(4, 8, generator=generator)
        accelerator.backward(model(x).pow(2).mean())
        optimizer.step()
        optimizer.zero_grad()
    return flat_params(accelerator.unwrap_model(model))


def rank_ddp_kwargs() -> dict:
    from accel_train import DistributedDataParallelKwargs

    handler = DistributedDataParallelKwargs(find_unused_parameters=True, broadcast_buffers=False, bucket_cap_mb=5)
    accelerator = _fresh(kwargs_handlers=[handler])
    model = accelerator.prepare(torch.nn.Linear(2, 2))
    evaluation = accelerator.prepare_model(torch.nn.Linear(2, 2), evaluation_mode=True)
    frozen = torch.nn.Linear(2, 2).requires_grad_(False)
    return {
        "find_unused": model.find_unused_parameters,
        "broadcast_buffers": model.broadcast_buffers,
        "evaluation": type(evaluation).__name__,
        "frozen": type(accelerator.prepare(frozen)).__name__,
        "unwrapped": type(accelerator.unwrap_model(model)).__name__,
    }


def rank_local_sgd() -> dict:
    from accel_train import LocalSGD

    accelerator = _fresh()
    torch.manual_seed(2)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    generator = torch.Generator().manual_seed(accelerator.process_index)
    snapshots = []
    with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=2) as local_sgd:
        for _ in range(4):
            accelerator.backward(model(torch.randn(3, 4, generator=generator)).sum())
            optimizer.step()
            optimizer.zero_grad()
            local_sgd.step()
            snapshots.append(flat_params(accelerator.unwrap_model(model)))
    return {"snapshots": snapshots}


def rank_no_sync_and_trigger() -> dict:
    accelerator = _fresh()
    torch.manual_seed(3)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    x = torch.full((2, 4), float(accelerator.process_index + 1))
    with accelerator.no_sync(model):
        loss_a = model(x).sum()
        loss_b = model(x * 2).sum()
    accelerator.backward(loss_a)
    local_grad = model.module.weight.grad.clone()
    with accelerator.trigger_sync_in_backward(model):
        accelerator.backward(loss_b)
    return {"local": local_grad, "synced": model.module.weight.grad.clone()}


def rank_join_uneven() -> int:
    accelerator = _fresh()
    torch.manual_seed(4)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(torch.randn(7, 4), batch_size=2)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    steps = 0
    with accelerator.join_uneven_inputs([model], even_batches=False):
        for x in loader:
            accelerator.backward(model(x).sum())
            optimizer.step()
            optimizer.zero_grad()
            steps += 1
    return steps


def rank_resume(folder: str, total_steps: int, save_at: int | None, load: bool) -> torch.Tensor:
    from accel_data import DataLoaderConfiguration
    from accel_state.random import set_seed

    # The loop does not skip by hand: it opts in to resuming at the saved batch.
    stateful = DataLoaderConfiguration(use_stateful_dataloader=True)
    accelerator = _fresh(gradient_accumulation_steps=2, dataloader_config=stateful)
    set_seed(7)
    model = TinyNet()
    model.drop.p = 0.0
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(regression_dataset(44), batch_size=3, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    if load:
        accelerator.load_state(folder)
    done = save_at if load else 0
    while done < total_steps:
        for x, y in loader:
            with accelerator.accumulate(model):
                accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
                optimizer.step()
                optimizer.zero_grad()
            done += 1
            if not load and save_at is not None and done == save_at:
                accelerator.save_state(folder)
                return flat_params(accelerator.unwrap_model(model))
            if done == total_steps:
                break
    return flat_params(accelerator.unwrap_model(model))


def rank_checkpoint_files(folder: str) -> list[str]:
    accelerator = _fresh()
    model = accelerator.prepare(TinyNet())
    accelerator.save_state(folder)
    accelerator.load_state(folder)
    accelerator.wait_for_everyone()  # each process adds its random states before its own save_state returns
    assert model is not None
    return sorted(os.listdir(folder))


# -- tests ------------------------------------------------------------------------------------------


def _baseline(accumulation: int, global_batch: int) -> torch.Tensor:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = regression_dataset(48).tensors
    size = global_batch * accumulation
    for start in range(0, len(x), size):
        torch.nn.functional.mse_loss(model(x[start : start + size]), y[start : start + size]).backward()
        optimizer.step()
        optimizer.zero_grad()
    return flat_params(model)


@pytest.mark.parametrize("accumulation", [1, 2])
def test_ddp_training_equals_single_process_on_global_batch(dist_pool: DistributedPool, accumulation: int) -> None:
    results = dist_pool.run(rank_ddp_training, accumulation, 4)
    assert results[0]["wrapped"] == "DistributedDataParallel"
    assert torch.equal(results[0]["params"], results[1]["params"])
    assert torch.allclose(results[0]["params"], _baseline(accumulation, 8), atol=1e-5)
    expected_syncs = [True] * 6 if accumulation == 1 else [False, True] * 3
    assert results[0]["syncs"] == expected_syncs
    for grad_0, grad_1 in zip(results[0]["non_sync_grads"], results[1]["non_sync_grads"]):
        assert not torch.allclose(grad_0, grad_1)  # no all-reduce on accumulation steps


def test_scheduler_steps_per_process_and_sync_each_batch(dist_pool: DistributedPool) -> None:
    results = dist_pool.run(rank_scheduler_and_sync_each_batch)
    # 2 optimizer steps, each stepping the scheduler once per process (batches are not split).
    assert results[0]["lr"] == pytest.approx(0.1 * 0.5**4)
    for grad_0, grad_1 in zip(results[0]["grads"], results[1]["grads"]):
        assert torch.allclose(grad_0, grad_1)  # sync_each_batch: gradients all-reduced every batch


def test_collectives(dist_pool: DistributedPool) -> None:
    results = dist_pool.run(rank_collectives)
    for rank, out in enumerate(results):
        assert out["gather"] == [0, 10, 1, 11]
        assert out["gather_nested"] == [0, 1]
        assert out["reduce_sum"] == [3.0] and out["reduce_mean"] == [1.5]
        assert out["objects"] == ["r0", "r1"]
        assert out["trigger"] is True and out["trigger_reset"] is False
    assert results[0]["pad"] == [0, -1] and results[1]["pad"] == [0, 1]
    assert results[0]["pad_first"] == [0, 0] and results[1]["pad_first"] == [0, 1]
    assert results[0]["split"] == ["a", "b"] and results[1]["split"] == ["c", "c"]
    assert results[0]["called"] == ["main"] and results[1]["called"] == ["local1"]


@pytest.mark.parametrize(("length", "batch"), [(9, 2), (8, 2), (13, 4)])
def test_gather_for_metrics_drops_duplicated_tail(dist_pool: DistributedPool, length: int, batch: int) -> None:
    results = dist_pool.run(rank_gather_for_metrics, length, batch)
    for out in results:
        assert out["tensors"] == list(range(length))
        assert out["objects"] == list(range(length))


@pytest.mark.parametrize(
    ("hook", "wrapper", "options"),
    [
        ("fp16", "no", {}),
        ("power_sgd", "no", {"matrix_approximation_rank": 8, "start_powerSGD_iter": 2}),
        ("power_sgd", "fp16", {"matrix_approximation_rank": 8, "start_powerSGD_iter": 2}),
    ],
)
def test_ddp_communication_hooks(dist_pool: DistributedPool, hook: str, wrapper: str, options: dict) -> None:
    plain = dist_pool.run(rank_comm_hook, "none", "no", {})
    hooked = dist_pool.run(rank_comm_hook, hook, wrapper, options)
    assert torch.equal(hooked[0], hooked[1])
    assert torch.allclose(hooked[0], plain[0], atol=5e-3)


def rank_bf16_hook_on_gloo() -> str:
    from accel_train import DistributedDataParallelKwargs

    accelerator = _fresh(kwargs_handlers=[DistributedDataParallelKwargs(comm_hook="bf16")])
    try:
        accelerator.prepare(torch.nn.Linear(2, 2))
    except ValueError as error:
        return str(error)
    return "no error"


def test_bf16_hook_needs_nccl(dist_pool: DistributedPool) -> None:
    messages = dist_pool.run(rank_bf16_hook_on_gloo)
    assert all("only with NCCL" in m and "'gloo'" in m for m in messages)


def test_ddp_kwargs_reach_ddp_and_evaluation_mode_skips_it(dist_pool: DistributedPool) -> None:
    for out in dist_pool.run(rank_ddp_kwargs):
        assert out == {
            "find_unused": True,
            "broadcast_buffers": False,
            "evaluation": "Linear",
            "frozen": "Linear",
            "unwrapped": "Linear",
        }


def test_local_sgd_averages_every_n_steps(dist_pool: DistributedPool) -> None:
    results = dist_pool.run(rank_local_sgd)
    snapshots_0, snapshots_1 = results[0]["snapshots"], results[1]["snapshots"]
    assert not torch.allclose(snapshots_0[0], snapshots_1[0])  # step 1: each process on its own
    assert torch.allclose(snapshots_0[1], snapshots_1[1])  # step 2: averaged
    assert not torch.allclose(snapshots_0[2], snapshots_1[2])
    assert torch.allclose(snapshots_0[3], snapshots_1[3])


def test_no_sync_and_trigger_sync_in_backward(dist_pool: DistributedPool) -> None:
    results = dist_pool.run(rank_no_sync_and_trigger)
    assert not torch.allclose(results[0]["local"], results[1]["local"])
    assert torch.allclose(results[0]["synced"], results[1]["synced"])


def test_join_uneven_inputs(dist_pool: DistributedPool) -> None:
    assert dist_pool.run(rank_join_uneven) == [2, 2]


@pytest.mark.parametrize("save_at", [4, 5])  # mid-epoch at a sync step, and mid-accumulation
def test_resume_is_exact_on_two_processes(dist_pool: DistributedPool, tmp_path, save_at: int) -> None:
    folder = str(tmp_path / "ckpt")
    uninterrupted = dist_pool.run(rank_resume, folder, 13, None, False)
    dist_pool.run(rank_resume, folder, 13, save_at, False)
    assert "accumulated_grads_1.safetensors" in os.listdir(folder) or save_at % 2 == 0
    resumed = dist_pool.run(rank_resume, folder, 13, save_at, True)
    assert torch.equal(resumed[0], uninterrupted[0]) and torch.equal(resumed[1], uninterrupted[1])


def test_checkpoint_has_random_states_of_every_process(dist_pool: DistributedPool, tmp_path) -> None:
    folder = str(tmp_path / "ckpt")
    files = dist_pool.run(rank_checkpoint_files, folder)
    assert files[0] == files[1]
    assert {"random_states_0.safetensors", "random_states_1.safetensors", "model.safetensors"} <= set(files[0])
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]
