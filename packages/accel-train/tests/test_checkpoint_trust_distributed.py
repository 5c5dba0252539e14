"""Checkpoints across processes, on real gloo processes (CPU):

* DeepSpeed ZeRO 2 / 3: a crafted pickle in the engine's own files is refused on every rank before the
  engine reads anything (marker absent, parameters unchanged).
* Resharding: a checkpoint written by N processes loads on M (2->1, 1->2, 2->4) for DDP and FSDP2
  (sharded state); model, optimizer state, scheduler, the random states of the ranks that exist and the
  data position (skipped explicitly with ``skip_first_batches``) carry over, and the continued run equals
  an uninterrupted run on M processes within 1e-5.
"""

from __future__ import annotations

import os

import pytest
import torch
from fsdp_helpers import BlockNet

from accel_state.imports import is_deepspeed_available
from accel_state.testing import DistributedPool, reset_shared_state

pytestmark = pytest.mark.slow

GLOBAL_BATCH = 8
STEPS = 6
SAVE_AT = 3


@pytest.fixture(scope="module")
def pools():
    opened: dict[int, DistributedPool] = {}

    def get(world: int) -> DistributedPool:
        if world not in opened:
            opened[world] = DistributedPool(world_size=world, timeout=600).start()
        return opened[world]

    yield get
    for pool in opened.values():
        pool.close()


class _Exploit:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


# -- resharding ------------------------------------------------------------------------------------


class _Samples(torch.utils.data.Dataset):
    def __init__(self, count: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(count, 4, generator=generator)
        self.y = self.x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.3

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int):
        return self.x[index], self.y[index]


def rank_run(backend: str, folder: str | None, save_at: int | None, load: bool) -> dict:
    """STEPS optimizer steps of global batch GLOBAL_BATCH (each process GLOBAL_BATCH / world samples);
    with ``save_at`` stop and save there; with ``load`` resume from ``folder`` at its step."""
    reset_shared_state()
    from accel_train import Accelerator, FullyShardedDataParallelPlugin

    plugin = None
    if backend == "fsdp2":
        plugin = FullyShardedDataParallelPlugin(
            fsdp_version=2, state_dict_type="SHARDED_STATE_DICT", auto_wrap_policy="TRANSFORMER_BASED_WRAP"
        )
    # The scheduler steps once per optimizer step (by default it steps once per process, so its count
    # would depend on the number of processes and could not match a run on another number).
    accelerator = Accelerator(fsdp_plugin=plugin, step_scheduler_with_optimizer=False)
    world = accelerator.num_processes
    torch.manual_seed(0)
    model = BlockNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    loader = torch.utils.data.DataLoader(_Samples(GLOBAL_BATCH * STEPS), batch_size=GLOBAL_BATCH // world)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    out: dict = {}
    start = 0
    if load:
        accelerator.load_state(folder)
        out["draw_after_load"] = torch.rand(3)
        start = accelerator.step if accelerator.step else SAVE_AT
        loader = accelerator.skip_first_batches(loader, start)
    for index, (x, y) in enumerate(loader, start=start):
        if save_at is not None and index >= save_at:
            break
        accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    if save_at is not None:
        accelerator.save_state(folder)
        out["draw_after_save"] = torch.rand(3)
    out["state"] = {k: v.detach().float().cpu() for k, v in accelerator.get_state_dict(model).items()}
    out["lr"] = scheduler.get_last_lr()[0]
    out["optimizer_steps"] = sorted({int(s["step"]) for s in optimizer.optimizer.state.values() if "step" in s})
    reset_shared_state()
    return out


@pytest.mark.parametrize("backend", ["ddp", "fsdp2"])
def test_checkpoint_of_n_processes_resumes_on_m(pools, tmp_path, backend: str) -> None:
    uninterrupted = {m: pools(m).run(rank_run, backend, None, None, False)[0] for m in (1, 2, 4)}
    for saved_on, loaded_on in [(2, 1), (1, 2), (2, 4)]:
        folder = str(tmp_path / f"ckpt_{saved_on}_{loaded_on}")
        saved = pools(saved_on).run(rank_run, backend, folder, SAVE_AT, False)
        resumed = pools(loaded_on).run(rank_run, backend, folder, None, True)
        reference = uninterrupted[loaded_on]
        for rank, result in enumerate(resumed):
            assert result["lr"] == reference["lr"], (saved_on, loaded_on)
            assert result["optimizer_steps"] == [STEPS], (saved_on, loaded_on)
            for name, value in reference["state"].items():
                torch.testing.assert_close(result["state"][name], value, atol=1e-5, rtol=0)
            if rank < saved_on:  # the random states of the ranks that exist carry over
                assert torch.equal(result["draw_after_load"], saved[rank]["draw_after_save"])
        # The continued run did train: it differs from the state at the save.
        assert any(not torch.equal(saved[0]["state"][k], reference["state"][k]) for k in reference["state"])


# -- DeepSpeed: crafted engine files ---------------------------------------------------------------------


def rank_deepspeed_crafted(stage: int, folder: str, craft: str, marker: str) -> dict:
    reset_shared_state()
    from accel_train import Accelerator, DeepSpeedPlugin

    plugin = DeepSpeedPlugin(zero_stage=stage, zero3_save_16bit_model=True)
    accelerator = Accelerator(deepspeed_plugin=plugin)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(_Samples(16), batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    def train() -> None:
        for x, y in loader:
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            optimizer.step()
            optimizer.zero_grad()

    train()
    accelerator.save_state(folder)
    accelerator.wait_for_everyone()
    tag = os.path.join(folder, "pytorch_model")
    if accelerator.is_main_process:
        name = next(n for n in sorted(os.listdir(tag)) if craft in n)
        torch.save({"module": _Exploit(marker)}, os.path.join(tag, name))
    accelerator.wait_for_everyone()
    train()
    before = {k: v.detach().float().clone() for k, v in accelerator.get_state_dict(model).items()}
    error = ""
    try:
        accelerator.load_state(folder)
    except Exception as raised:
        error = f"{type(raised).__name__}: {raised}"
    after = {k: v.detach().float().clone() for k, v in accelerator.get_state_dict(model).items()}
    unchanged = all(torch.equal(before[k], after[k]) for k in before)
    reset_shared_state()
    return {"error": error, "unchanged": unchanged, "ran": os.path.exists(marker)}


@pytest.mark.skipif(not is_deepspeed_available(), reason='needs DeepSpeed: pip install "accel-train[deepspeed]"')
@pytest.mark.parametrize(("stage", "craft"), [(2, "model_states"), (2, "optim_states"), (3, "optim_states")])
def test_deepspeed_crafted_engine_file_runs_nothing(pools, tmp_path, stage: int, craft: str) -> None:
    marker = str(tmp_path / "marker")
    results = pools(2).run(rank_deepspeed_crafted, stage, str(tmp_path / "ckpt"), craft, marker)
    for result in results:
        assert result["error"].startswith("UnsafeCheckpointError"), result["error"]
        assert craft in result["error"] and "GLOBAL builtins.exec" in result["error"]
        assert result["unchanged"] and not result["ran"]
    assert not os.path.exists(marker)


# -- FSDP2 cases reported broken elsewhere, each against DDP ----------------------------------------------


class _Tied(torch.nn.Module):
    """A language-model shape: the output head shares the embedding's weight."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(16, 8)
        self.block = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, 16, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.block(self.embed(tokens))))


def rank_tied_twice(backend: str, folder: str) -> dict:
    """Tied embeddings; save after 2 steps, train 2 more; load the checkpoint twice in the same process
    and train the same 2 steps again: both continuations must match."""
    reset_shared_state()
    from accel_train import Accelerator, FullyShardedDataParallelPlugin

    plugin = None
    if backend == "fsdp2":
        plugin = FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type="SHARDED_STATE_DICT")
    accelerator = Accelerator(fsdp_plugin=plugin)
    torch.manual_seed(0)
    model = _Tied()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    generator = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, 16, (4, 3), generator=generator) for _ in range(4)]
    rank = accelerator.process_index

    def steps(chunk: list) -> None:
        for tokens in chunk:
            logits = model(tokens[rank :: accelerator.num_processes] if tokens.shape[0] > 1 else tokens)
            accelerator.backward(logits.logsumexp(-1).mean())
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()

    def state() -> dict:
        return {k: v.detach().float().cpu().clone() for k, v in accelerator.get_state_dict(model).items()}

    steps(batches[:2])
    accelerator.save_state(folder)
    steps(batches[2:])
    uninterrupted = state()
    continued = []
    for _ in range(2):
        accelerator.load_state(folder)
        steps(batches[2:])
        continued.append(state())
    tied = accelerator.unwrap_model(model)
    shares = tied.head.weight is tied.embed.weight
    reset_shared_state()
    return {"uninterrupted": uninterrupted, "continued": continued, "tied": shares, "lr": scheduler.get_last_lr()}


def test_fsdp2_tied_embeddings_and_loading_twice_equal_ddp(pools, tmp_path) -> None:
    ddp = pools(2).run(rank_tied_twice, "ddp", str(tmp_path / "ddp"))[0]
    fsdp = pools(2).run(rank_tied_twice, "fsdp2", str(tmp_path / "fsdp"))[0]
    assert fsdp["tied"] and ddp["tied"]
    for result in (ddp, fsdp):
        for continued in result["continued"]:
            for name, value in result["uninterrupted"].items():
                torch.testing.assert_close(continued[name], value, atol=1e-6, rtol=0)
    for name, value in ddp["uninterrupted"].items():
        torch.testing.assert_close(fsdp["uninterrupted"][name], value, atol=1e-5, rtol=0)
    assert fsdp["lr"] == ddp["lr"]
