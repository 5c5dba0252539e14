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
from fsdp_helpers import BlockNet, crafted_torch_file, replace_dcp_item
from train_helpers import regression_dataset, train_epoch

from accel_state.imports import is_deepspeed_available
from accel_state.install_hints import install_hint
from accel_state.testing import reset_shared_state

pytestmark = pytest.mark.slow

GLOBAL_BATCH = 8
STEPS = 6
SAVE_AT = 3


class _Exploit:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


# -- resharding ------------------------------------------------------------------------------------


class PlannedBlockNet(BlockNet):
    """The block model with a tensor-parallel plan (used where the run has tp > 1)."""

    tp_plan = {"blocks.*.up": "colwise", "blocks.*.down": "rowwise"}


#: ParallelismConfig sizes of the ND families on each number of processes (1: FSDP2 on one process, whose
#: checkpoint has the same layout: a trivial ParallelismConfig is no ND run).
ND_SIZES = {
    "tp": {2: {"tp_size": 2}, 4: {"dp_shard_size": 2, "tp_size": 2}},
    "hsdp": {2: {"dp_shard_size": 2}, 4: {"dp_replicate_size": 2, "dp_shard_size": 2}},
}

#: (written on N, loaded on M) per backend; an HSDP checkpoint needs 4 processes to be written.
RESHARDS = {
    "ddp": [(2, 1), (1, 2), (2, 4)],
    "fsdp2": [(2, 1), (1, 2), (2, 4)],
    "fsdp1": [(2, 1), (1, 2), (2, 4)],
    "tp": [(2, 1), (1, 2), (2, 4)],
    "hsdp": [(4, 2), (4, 1), (2, 4)],
}


def _reshard_accelerator(backend: str, world: int):
    from accel_data import DataLoaderConfiguration
    from accel_train import Accelerator, FullyShardedDataParallelPlugin
    from accel_train.parallelism_config import ParallelismConfig

    # The scheduler steps once per optimizer step (by default it steps once per process, so its count
    # would depend on the number of processes and could not match a run on another number).
    # The loader continues at the saved batch by itself (use_stateful_dataloader): the data position comes
    # from the checkpoint, not from the test.
    kwargs: dict = {
        "step_scheduler_with_optimizer": False,
        "dataloader_config": DataLoaderConfiguration(use_stateful_dataloader=True),
    }
    if backend != "ddp":
        kwargs["fsdp_plugin"] = FullyShardedDataParallelPlugin(
            fsdp_version=1 if backend == "fsdp1" else 2,
            state_dict_type="SHARDED_STATE_DICT",
            auto_wrap_policy="TRANSFORMER_BASED_WRAP",
        )
    sizes = ND_SIZES.get(backend, {}).get(world)
    if sizes:
        kwargs["parallelism_config"] = ParallelismConfig(**sizes)
    return Accelerator(**kwargs), (sizes or {}).get("tp_size", 1)


def rank_run(backend: str, folder: str, save_at: int | None, load: bool) -> dict:
    """STEPS optimizer steps of global batch GLOBAL_BATCH (each data-parallel rank GLOBAL_BATCH / its
    number); with ``save_at`` save there and go on; with ``load`` resume from ``folder`` at its step."""
    reset_shared_state()
    accelerator, tp = _reshard_accelerator(backend, int(os.environ["WORLD_SIZE"]))
    data_parallel = accelerator.num_processes // tp
    torch.manual_seed(0)
    model = PlannedBlockNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    loader = torch.utils.data.DataLoader(
        regression_dataset(GLOBAL_BATCH * STEPS), batch_size=GLOBAL_BATCH // data_parallel
    )
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    out: dict = {}
    start = 0
    if load:
        accelerator.load_state(folder)
        out["draw_after_load"] = torch.rand(3)
        start = loader.state_dict()["batches_yielded"]
        out["samples_skipped"] = start * loader.total_batch_size
    for index, (x, y) in enumerate(loader, start=start):
        accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        if index + 1 == save_at:  # after save_at steps
            accelerator.save_state(folder)
            out["draw_after_save"] = torch.rand(3)
            out["at_save"] = {k: v.detach().float().cpu() for k, v in accelerator.get_state_dict(model).items()}
    out["state"] = {k: v.detach().float().cpu() for k, v in accelerator.get_state_dict(model).items()}
    out["lr"] = scheduler.get_last_lr()[0]
    out["optimizer_steps"] = sorted({int(s["step"]) for s in optimizer.optimizer.state.values() if "step" in s})
    reset_shared_state()
    return out


@pytest.mark.parametrize("backend", sorted(RESHARDS))
def test_checkpoint_of_n_processes_resumes_on_m(pools, tmp_path, backend: str) -> None:
    """One run per number of processes that saves at SAVE_AT and trains on (the uninterrupted run there),
    an uninterrupted run where nothing is saved, then a resumed run for each pair."""
    pairs = RESHARDS[backend]
    straight: dict[int, list[dict]] = {}
    for world in sorted({n for n, _ in pairs}):
        straight[world] = pools(world).run(rank_run, backend, str(tmp_path / f"saved_on_{world}"), SAVE_AT, False)
    for world in sorted({m for _, m in pairs} - set(straight)):
        straight[world] = pools(world).run(rank_run, backend, "", None, False)
    for saved_on, loaded_on in pairs:
        resumed = pools(loaded_on).run(rank_run, backend, str(tmp_path / f"saved_on_{saved_on}"), None, True)
        reference = straight[loaded_on][0]
        for rank, result in enumerate(resumed):
            where = (backend, saved_on, loaded_on, rank)
            assert result["samples_skipped"] == SAVE_AT * GLOBAL_BATCH, where
            assert result["lr"] == reference["lr"], where
            assert result["optimizer_steps"] == [STEPS], where
            for name, value in reference["state"].items():
                torch.testing.assert_close(
                    result["state"][name], value, atol=1e-5, rtol=0, msg=lambda m: f"{where}: {m}"
                )
            if rank < saved_on:  # the random states of the ranks that exist carry over
                assert torch.equal(result["draw_after_load"], straight[saved_on][rank]["draw_after_save"]), where
        # The continued run did train: it differs from the state at the save.
        at_save = straight[saved_on][0]["at_save"]
        assert any(not torch.equal(at_save[k], reference["state"][k]) for k in reference["state"])


# -- FSDP2 on two processes: each checks its share, all refuse alike ----------------------------------------


def rank_fsdp_crafted(folder: str, marker: str) -> list[dict]:
    """Save an FSDP2 sharded checkpoint; then load copies of it damaged where only process 0 checks (a
    tensor item of the model's first data file), where only process 1 checks (the optimizer's last item),
    and where every process looks (a missing data file). Each load must fail alike on both processes,
    before anything is loaded; the genuine folder loads after."""
    import shutil

    import torch.distributed as dist

    reset_shared_state()
    from accel_train import Accelerator, FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type="SHARDED_STATE_DICT")
    accelerator = Accelerator(fsdp_plugin=plugin)
    torch.manual_seed(0)
    model = BlockNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(regression_dataset(16), batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    def snapshot() -> list[torch.Tensor]:
        params = [v.detach().clone() for v in accelerator.get_state_dict(model).values()]
        moments = [
            (v.to_local() if hasattr(v, "to_local") else v).detach().clone()
            for state in optimizer.optimizer.state.values()
            for v in state.values()
            if isinstance(v, torch.Tensor)
        ]
        return params + moments

    train_epoch(accelerator, model, optimizer, loader)
    accelerator.save_state(folder)
    results = []
    for case in ("model_first", "optimizer_last", "missing_file"):
        damaged = f"{folder}_{case}"
        if accelerator.is_main_process:
            shutil.copytree(folder, damaged)
            if case == "model_first":
                replace_dcp_item(os.path.join(damaged, "pytorch_model_fsdp_0"), "first", crafted_torch_file(marker))
            elif case == "optimizer_last":
                replace_dcp_item(os.path.join(damaged, "optimizer_0"), "last", crafted_torch_file(marker))
            else:
                os.remove(os.path.join(damaged, "optimizer_0", "__1_0.distcp"))
        dist.barrier()
        train_epoch(
            accelerator, model, optimizer, loader
        )  # so that a load would visibly change the model and the optimizer
        before = snapshot()
        error = ""
        try:
            accelerator.load_state(damaged)
        except Exception as raised:
            error = f"{type(raised).__name__}: {raised}"
        after = snapshot()
        results.append(
            {
                "case": case,
                "error": error,
                "unchanged": all(torch.equal(a, b) for a, b in zip(before, after)),
                "ran": os.path.exists(marker),
            }
        )
    accelerator.load_state(folder)  # nothing is left hanging: the genuine folder loads
    reset_shared_state()
    return results


def test_fsdp2_crafted_checkpoint_is_refused_alike_on_every_process(pools, tmp_path) -> None:
    marker = str(tmp_path / "marker")
    on_rank = pools(2).run(rank_fsdp_crafted, str(tmp_path / "ckpt"), marker)
    for first, second in zip(*on_rank):
        assert first["error"] == second["error"], (first, second)  # the same verdict on both processes
        for result in (first, second):
            assert result["unchanged"] and not result["ran"], result
    expected = {
        "model_first": ("UnsafeCheckpointError", "pytorch_model_fsdp_0/__0_0.distcp"),
        "optimizer_last": ("UnsafeCheckpointError", "optimizer_0/__1_0.distcp"),
        "missing_file": ("FileNotFoundError", "__1_0.distcp, which is missing"),
    }
    for result in on_rank[0]:
        kind, named = expected[result["case"]]
        assert result["error"].startswith(kind) and named in result["error"], result
        if kind == "UnsafeCheckpointError":
            assert "GLOBAL builtins.exec" in result["error"]
    assert not os.path.exists(marker)


# -- DeepSpeed: crafted engine files ---------------------------------------------------------------------


def rank_deepspeed_crafted(stage: int, folder: str, craft: str, marker: str, plant_metadata: bool = False) -> dict:
    """Save a ZeRO checkpoint, craft the engine file whose name holds ``craft`` (with ``plant_metadata``, an
    empty DCP ``Metadata()`` beside it as ``pytorch_model/.metadata``) and load it."""
    reset_shared_state()
    from accel_train import Accelerator, DeepSpeedPlugin

    plugin = DeepSpeedPlugin(zero_stage=stage, zero3_save_16bit_model=True)
    accelerator = Accelerator(deepspeed_plugin=plugin)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(regression_dataset(16), batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    train_epoch(accelerator, model, optimizer, loader)
    accelerator.save_state(folder)
    accelerator.wait_for_everyone()
    tag = os.path.join(folder, "pytorch_model")
    if accelerator.is_main_process:
        name = next(n for n in sorted(os.listdir(tag)) if craft in n)
        torch.save({"module": _Exploit(marker)}, os.path.join(tag, name))
        if plant_metadata:
            import pickle

            from torch.distributed.checkpoint.metadata import Metadata

            with open(os.path.join(tag, ".metadata"), "wb") as handle:
                pickle.dump(Metadata(state_dict_metadata={}), handle)
    accelerator.wait_for_everyone()
    train_epoch(accelerator, model, optimizer, loader)
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


@pytest.mark.skipif(not is_deepspeed_available(), reason=f"needs DeepSpeed: {install_hint('accel-train', 'deepspeed')}")
@pytest.mark.parametrize(("stage", "craft"), [(2, "model_states"), (2, "optim_states"), (3, "optim_states")])
def test_deepspeed_crafted_engine_file_runs_nothing(pools, tmp_path, stage: int, craft: str) -> None:
    marker = str(tmp_path / "marker")
    results = pools(2).run(rank_deepspeed_crafted, stage, str(tmp_path / "ckpt"), craft, marker)
    for result in results:
        assert result["error"].startswith("UnsafeCheckpointError"), result["error"]
        assert craft in result["error"] and "GLOBAL builtins.exec" in result["error"]
        assert result["unchanged"] and not result["ran"]
    assert not os.path.exists(marker)


@pytest.mark.skipif(not is_deepspeed_available(), reason=f"needs DeepSpeed: {install_hint('accel-train', 'deepspeed')}")
def test_deepspeed_planted_metadata_turns_no_check_off(pools, tmp_path, capsys) -> None:
    """Issue 36, point 1: an empty DCP ``Metadata()`` planted as ``pytorch_model/.metadata`` of a ZeRO-2
    checkpoint with a crafted engine file is refused by name on both ranks (it made the check take the engine
    folder for a DCP folder and skip its ``.pt`` files); merge-weights refuses it too."""
    from accel_train.commands.merge import main

    marker = str(tmp_path / "marker")
    folder = str(tmp_path / "ckpt")
    results = pools(2).run(rank_deepspeed_crafted, 2, folder, "model_states", marker, True)
    planted = os.path.join(folder, "pytorch_model", ".metadata")
    for result in results:
        assert result["error"].startswith("UnsafeCheckpointError"), result["error"]
        assert planted in result["error"] and "inside a DeepSpeed engine folder" in result["error"]
        assert result["unchanged"] and not result["ran"]
    assert results[0]["error"] == results[1]["error"]
    capsys.readouterr()
    for given in (folder, os.path.dirname(planted)):  # the save_state folder, and the engine folder itself
        assert main([given, str(tmp_path / "merged")]) == 2
        assert planted in capsys.readouterr().err
        assert not os.path.exists(tmp_path / "merged")
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


class _NormNet(torch.nn.Module):
    """A linear layer, a LayerNorm (kept in float32 in a bf16 model, as language models keep their norms)
    and a head."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(4, 16)
        self.norm = torch.nn.LayerNorm(16)
        self.head = torch.nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.tanh(self.inp(x))
        hidden = self.norm(hidden.to(self.norm.weight.dtype)).to(hidden.dtype)
        return self.head(hidden)


def rank_fsdp2_case(backend: str, case: str, folder: str) -> dict:
    """Six micro-steps; save after the third, go on (the uninterrupted run), load, do the last three again.

    ``case``: ``mixed_dtypes`` (a bf16 model with an fp32 norm, no mixed precision), ``upcast`` (a model
    loaded in bf16 trained with ``mixed_precision="bf16"``), ``mid_accumulation`` (two micro-steps per
    optimizer step, so the save falls inside a cycle, and a scheduler). ``backend``: ``ddp``, ``fsdp2``, or
    ``fsdp2_fp32`` / ``ddp`` for ``upcast`` meaning the model was upcast by hand before ``prepare``, or ``nd``
    (the ND strategy with ``dp_shard_size=2``).
    """
    import warnings

    reset_shared_state()
    from accel_train import Accelerator, FullyShardedDataParallelPlugin
    from accel_train.parallelism_config import ParallelismConfig

    plugin = None
    if backend.startswith("fsdp2") or backend == "nd":
        plugin = FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type="SHARDED_STATE_DICT")
    sizes = ParallelismConfig(dp_shard_size=2) if backend == "nd" else None
    accelerator = Accelerator(
        fsdp_plugin=plugin,
        parallelism_config=sizes,
        mixed_precision="bf16" if case == "upcast" else "no",
        gradient_accumulation_steps=2 if case == "mid_accumulation" else 1,
    )
    torch.manual_seed(0)
    model = _NormNet()
    if case != "mid_accumulation":
        model = model.to(torch.bfloat16)  # loaded in bf16
    if case == "mixed_dtypes":
        model.norm.float()
    if case == "upcast" and backend != "fsdp2":
        model.float()  # upcast by hand: what FSDP2 must do by itself
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    rank, world = accelerator.process_index, accelerator.num_processes
    generator = torch.Generator().manual_seed(1)
    batches = [torch.randn(4, 4, generator=generator) for _ in range(6)]
    input_dtype = torch.bfloat16 if case == "mixed_dtypes" else torch.float32

    def local(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to_local() if hasattr(tensor, "to_local") else tensor

    def steps(chunk: list) -> None:
        for x in chunk:
            x = x[rank::world]
            with accelerator.accumulate(model):
                loss = (model(x.to(input_dtype)).float() - x.sum(dim=1, keepdim=True)).pow(2).mean()
                accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()

    def state() -> dict:
        return {k: v.detach().float().cpu().clone() for k, v in accelerator.get_state_dict(model).items()}

    def dtypes() -> dict:
        return {name.replace("module.", ""): local(p).dtype for name, p in model.named_parameters()}

    out = {"dtypes_prepared": dtypes(), "warnings": [str(w.message) for w in caught]}
    out["moment_dtypes"] = sorted(
        {str(v.dtype) for s in optimizer.optimizer.state.values() for k, v in s.items() if k == "exp_avg"}
    )
    steps(batches[:3])
    out["synced_at_save"] = accelerator.sync_gradients
    accelerator.save_state(folder)
    steps(batches[3:])
    out["uninterrupted"] = state()
    out["moment_dtypes"] = sorted(
        {str(v.dtype) for s in optimizer.optimizer.state.values() for k, v in s.items() if k == "exp_avg"}
    )
    accelerator.load_state(folder)
    out["dtypes_loaded"] = dtypes()
    steps(batches[3:])
    out["continued"] = state()
    out["lr"] = scheduler.get_last_lr()
    out["files"] = sorted(os.listdir(folder))
    reset_shared_state()
    return out


def _same(a: dict, b: dict, atol: float) -> None:
    assert a.keys() == b.keys()
    for name, value in a.items():
        torch.testing.assert_close(b[name], value, atol=atol, rtol=0, msg=lambda m: f"{name}: {m}")


def test_fsdp2_mixed_parameter_dtypes_equal_ddp(pools, tmp_path) -> None:
    """fp32 norms in a bf16 model (no mixed precision): FSDP2 shards the norm as a unit of its own (a unit
    has one dtype), keeps every dtype through save and load, and trains like DDP."""
    ddp = pools(2).run(rank_fsdp2_case, "ddp", "mixed_dtypes", str(tmp_path / "ddp"))[0]
    fsdp = pools(2).run(rank_fsdp2_case, "fsdp2", "mixed_dtypes", str(tmp_path / "fsdp"))[0]
    expected = {"inp.weight": torch.bfloat16, "inp.bias": torch.bfloat16, "norm.weight": torch.float32}
    for result in (ddp, fsdp):
        for when in ("dtypes_prepared", "dtypes_loaded"):
            assert {k: result[when][k] for k in expected} == expected, (when, result[when])
        _same(result["uninterrupted"], result["continued"], atol=0)
    _same(ddp["uninterrupted"], fsdp["uninterrupted"], atol=1e-2)  # bf16 weights: reductions round alike


def test_fsdp2_upcasts_a_bf16_model_under_mixed_precision(pools, tmp_path) -> None:
    """A model loaded in bf16 trained with mixed_precision="bf16": FSDP2 keeps float32 weights and optimizer
    state (as documented, with a warning), so it trains exactly as the same model upcast by hand, and like DDP
    of the upcast model; checkpoints hold float32."""
    from accel_train.checkpoint.safety import read_dcp_metadata

    fsdp = pools(2).run(rank_fsdp2_case, "fsdp2", "upcast", str(tmp_path / "fsdp"))[0]
    by_hand = pools(2).run(rank_fsdp2_case, "fsdp2_fp32", "upcast", str(tmp_path / "by_hand"))[0]
    ddp = pools(2).run(rank_fsdp2_case, "ddp", "upcast", str(tmp_path / "ddp"))[0]
    assert set(fsdp["dtypes_prepared"].values()) == {torch.float32}
    assert set(fsdp["dtypes_loaded"].values()) == {torch.float32}
    assert fsdp["moment_dtypes"] == ["torch.float32"]
    assert any("upcast" in w and "float32" in w for w in fsdp["warnings"]), fsdp["warnings"]
    assert not any("upcast" in w for w in by_hand["warnings"])  # nothing to upcast
    _same(by_hand["uninterrupted"], fsdp["uninterrupted"], atol=0)
    _same(fsdp["uninterrupted"], fsdp["continued"], atol=0)
    _same(ddp["uninterrupted"], fsdp["uninterrupted"], atol=2e-2)  # bf16 compute: autocast vs FSDP's casts
    metadata = read_dcp_metadata(str(tmp_path / "fsdp" / "pytorch_model_fsdp_0" / ".metadata"))
    saved = {item.properties.dtype for item in metadata.state_dict_metadata.values() if hasattr(item, "properties")}
    assert saved == {torch.float32}


def test_fsdp2_resumes_mid_accumulation_with_a_scheduler_like_ddp(pools, tmp_path) -> None:
    """Saved after the first micro-step of an accumulation cycle (FSDP2 holds that micro-step's gradients
    unsharded per process): the resumed run finishes the cycle with them and equals the uninterrupted one,
    and DDP, under the FSDP strategy and the ND strategy's FSDP2; the scheduler's count carries over."""
    ddp = pools(2).run(rank_fsdp2_case, "ddp", "mid_accumulation", str(tmp_path / "ddp"))
    fsdp = pools(2).run(rank_fsdp2_case, "fsdp2", "mid_accumulation", str(tmp_path / "fsdp"))
    nd = pools(2).run(rank_fsdp2_case, "nd", "mid_accumulation", str(tmp_path / "nd"))
    for result in (*ddp, *fsdp, *nd):
        assert result["synced_at_save"] is False  # the save fell inside a cycle
        assert "accumulated_grads_0.safetensors" in result["files"]
        _same(result["uninterrupted"], result["continued"], atol=1e-6)
    _same(ddp[0]["uninterrupted"], fsdp[0]["uninterrupted"], atol=1e-5)
    _same(ddp[0]["uninterrupted"], nd[0]["uninterrupted"], atol=1e-5)
    # three optimizer steps; a prepared scheduler steps once per process at each (the documented default)
    assert fsdp[0]["lr"] == ddp[0]["lr"] == nd[0]["lr"] == [0.01 * 0.8**6]


def rank_save_local_state(folder: str) -> None:
    reset_shared_state()
    from accel_train import Accelerator, FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=1, state_dict_type="LOCAL_STATE_DICT", auto_wrap_policy="TRANSFORMER_BASED_WRAP"
    )
    accelerator = Accelerator(fsdp_plugin=plugin)
    model = accelerator.prepare(BlockNet())
    accelerator.prepare(torch.optim.AdamW(model.parameters(), lr=0.01))
    accelerator.save_state(folder)
    reset_shared_state()


def rank_refused_load(kind: str, folder: str) -> dict:
    """Load, on this number of processes, a checkpoint that cannot be read here: the error, and whether the
    model changed (it must not: the refusal comes before anything loads)."""
    reset_shared_state()
    from accel_train import Accelerator, FullyShardedDataParallelPlugin

    if kind == "sharded_without_fsdp":  # written here by FSDP2, read by a run without FSDP
        plugin = FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type="SHARDED_STATE_DICT")
        writer = Accelerator(fsdp_plugin=plugin)
        writer.prepare(BlockNet())
        writer.save_state(folder)
        reset_shared_state()
    plugin = None
    if kind == "local_state":
        plugin = FullyShardedDataParallelPlugin(
            fsdp_version=1, state_dict_type="LOCAL_STATE_DICT", auto_wrap_policy="TRANSFORMER_BASED_WRAP"
        )
    accelerator = Accelerator(fsdp_plugin=plugin, gradient_accumulation_steps=2 if kind == "mid_accumulation" else 1)
    torch.manual_seed(7)
    model = _NormNet() if kind == "mid_accumulation" else BlockNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    if kind == "mid_accumulation":
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.8)
        model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    else:
        model, optimizer = accelerator.prepare(model, optimizer)
    before = {k: v.detach().clone() for k, v in accelerator.get_state_dict(model).items()}
    error = ""
    try:
        accelerator.load_state(folder)
    except Exception as raised:
        error = f"{type(raised).__name__}: {raised}"
    after = accelerator.get_state_dict(model)
    unchanged = all(torch.equal(before[k], after[k]) for k in before)
    reset_shared_state()
    return {"error": error, "unchanged": unchanged}


def test_what_cannot_resume_on_another_number_is_refused_by_name(pools, tmp_path) -> None:
    """Each refused before anything loads: FSDP1 LOCAL_STATE_DICT (per process by design) and a save between
    two accumulation micro-steps (each process's gradients so far) on another number of processes, and a
    sharded checkpoint read by a run without FSDP (what to do instead is said)."""
    pools(2).run(rank_save_local_state, str(tmp_path / "local"))
    pools(2).run(rank_fsdp2_case, "ddp", "mid_accumulation", str(tmp_path / "mid"))
    local = pools(1).run(rank_refused_load, "local_state", str(tmp_path / "local"))[0]
    mid = pools(1).run(rank_refused_load, "mid_accumulation", str(tmp_path / "mid"))[0]
    plain = pools(1).run(rank_refused_load, "sharded_without_fsdp", str(tmp_path / "sharded"))[0]
    assert local["error"].startswith("ValueError") and "LOCAL_STATE_DICT checkpoint of 2 processes" in local["error"]
    assert mid["error"].startswith("ValueError") and "resumes only on 2 processes, not 1" in mid["error"]
    assert plain["error"].startswith("CheckpointMismatchError") and "accel merge-weights" in plain["error"]
    assert "SHARDED_STATE_DICT" in plain["error"]
    assert local["unchanged"] and mid["unchanged"] and plain["unchanged"]


def rank_run_checks(same_files: bool) -> dict:
    """``run_checks`` over five checks whose fourth refuses, on every process; with ``same_files`` False the
    processes' plans differ (as when each machine has its own copy of a folder that differs)."""
    import torch.distributed as dist

    from accel_state.errors import UnsafeCheckpointError
    from accel_state.state import PartialState
    from accel_train.checkpoint.safety import run_checks

    reset_shared_state()
    PartialState()  # the process group
    rank = dist.get_rank()
    ran: list[int] = []

    def check(index: int) -> None:
        ran.append(index)
        if index == 3:
            raise UnsafeCheckpointError(f"item{index}", "GLOBAL builtins.exec")

    def plan() -> list:
        labels = [f"item{i}" if same_files or i != 4 else f"item{i}@rank{rank}" for i in range(5)]
        return [(label, lambda i=i: check(i)) for i, label in enumerate(labels)]

    error = ""
    try:
        run_checks(plan, distributed=True)
    except UnsafeCheckpointError as raised:
        error = str(raised)
    reset_shared_state()
    return {"ran": ran, "error": error}


def test_checks_are_shared_out_and_every_process_gets_the_verdict(pools) -> None:
    shared = pools(2).run(rank_run_checks, True)
    assert [r["ran"] for r in shared] == [[0, 1], [2, 3]]  # one slice each; process 0 never ran check 3
    assert shared[0]["error"] == shared[1]["error"] and "item3" in shared[0]["error"]
    apart = pools(2).run(rank_run_checks, False)  # the processes see different files: each checks all
    assert [r["ran"] for r in apart] == [[0, 1, 2, 3], [2, 3, 0, 1]]
    assert apart[0]["error"] == apart[1]["error"] and "item3" in apart[0]["error"]
