"""DeepSpeed ZeRO checkpoints resumed on another number of processes, on real gloo processes (CPU).

A checkpoint written by N processes loads on M (2->1, 1->2, 2->4) for ZeRO 1, 2 and 3: accel converts it
to DeepSpeed's universal checkpoint in a hidden folder next to it (removed after), checking every file with
its allow-list first. The model, the Adam moments and step, the scheduler, the random states of the ranks
that exist and the data position (the step in the manifest, skipped with ``skip_first_batches``) carry
over, and the continued run equals an uninterrupted run on M processes within 1e-5.

One saving run per stage and process count serves as the uninterrupted run on that count too (it saves at
``SAVE_AT`` and trains on), so a stage costs three such runs (1, 2, 4 processes) and three loading runs.
"""

from __future__ import annotations

import os

import pytest
import torch
from train_helpers import regression_dataset, train_epoch

from accel_state.imports import is_deepspeed_available
from accel_state.install_hints import install_hint
from accel_state.testing import reset_shared_state

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not is_deepspeed_available(), reason=f"needs DeepSpeed: {install_hint('accel-train', 'deepspeed')}"
    ),
]

GLOBAL_BATCH = 8
STEPS = 6
SAVE_AT = 3


class _Net(torch.nn.Module):
    """97 parameters (no partition boundary falls on a tensor boundary at 2 or 4 processes) and a buffer that
    counts forward calls (DeepSpeed's universal load restores parameters only; accel restores buffers)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        self.register_buffer("calls", torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.calls += 1
        return self.body(x)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return _Net()


def rank_run(stage: int, folder: str, save: bool) -> dict:
    """STEPS optimizer steps of global batch GLOBAL_BATCH; with ``save`` save at SAVE_AT and train on (the
    uninterrupted run), else resume from ``folder`` at its step."""
    reset_shared_state()
    from accel_train import Accelerator, DeepSpeedPlugin

    plugin = DeepSpeedPlugin(zero_stage=stage, zero3_save_16bit_model=True, gradient_clipping=0.0)
    accelerator = Accelerator(deepspeed_plugin=plugin, step_scheduler_with_optimizer=False)
    world = accelerator.num_processes
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    loader = torch.utils.data.DataLoader(regression_dataset(GLOBAL_BATCH * STEPS), batch_size=GLOBAL_BATCH // world)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    out: dict = {}
    start = 0
    if not save:
        accelerator.load_state(folder)
        out["draw_after_load"] = torch.rand(3)
        out["step_after_load"] = accelerator.step
        start = accelerator.step
        loader = accelerator.skip_first_batches(loader, start)
        accelerator.wait_for_everyone()
        out["leftovers"] = sorted(n for n in os.listdir(os.path.dirname(folder)) if n.startswith("."))
    for index, (x, y) in enumerate(loader, start=start):
        if save and index == SAVE_AT:
            accelerator.save_state(folder)
            out["draw_after_save"] = torch.rand(3)
            out["state_at_save"] = {k: v.detach().float().cpu() for k, v in accelerator.get_state_dict(model).items()}
        with accelerator.accumulate(model):
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
    out["state"] = {k: v.detach().float().cpu() for k, v in accelerator.get_state_dict(model).items()}
    out["lr"] = scheduler.get_last_lr()[0]
    out["adam_steps"] = _adam_steps(model)
    reset_shared_state()
    return out


def _adam_steps(engine) -> list[int]:
    """The distinct ``step`` values of this rank's Adam states (DeepSpeed keeps one per partition)."""
    inner = engine.optimizer.optimizer if hasattr(engine.optimizer, "optimizer") else engine.optimizer
    return sorted({int(s["step"]) for s in inner.state.values() if "step" in s})


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_checkpoint_resumes_on_another_number_of_processes(pools, tmp_path, capsys, stage: int) -> None:
    folders = {n: str(tmp_path / f"saved_on_{n}" / "ckpt") for n in (1, 2, 4)}
    uninterrupted = {m: pools(m).run(rank_run, stage, folders[m], True) for m in (1, 2, 4)}
    for saved_on, loaded_on in [(2, 1), (1, 2), (2, 4)]:
        resumed = pools(loaded_on).run(rank_run, stage, folders[saved_on], False)
        reference = uninterrupted[loaded_on][0]
        for rank, result in enumerate(resumed):
            case = (stage, saved_on, loaded_on, rank)
            assert result["step_after_load"] == SAVE_AT, case
            assert result["lr"] == reference["lr"], case
            assert result["adam_steps"] == [STEPS], case
            assert result["state"]["calls"].item() == STEPS, case  # the buffer came back at SAVE_AT
            for name, value in reference["state"].items():
                torch.testing.assert_close(
                    result["state"][name], value, atol=1e-5, rtol=0, msg=lambda m: f"{case}: {m}"
                )
            if rank < saved_on:  # the random states of the ranks that exist carry over
                assert torch.equal(result["draw_after_load"], uninterrupted[saved_on][rank]["draw_after_save"]), case
            assert result["leftovers"] == [], case  # the universal conversion is removed after loading
        # The continued run did train past the save.
        saved_state = uninterrupted[saved_on][0]["state_at_save"]
        assert any(not torch.equal(saved_state[k], resumed[0]["state"][k]) for k in saved_state)
    _check_merge_weights(tmp_path, folders, uninterrupted, capsys)


def _check_merge_weights(tmp_path, folders: dict, runs: dict, capsys) -> None:
    """``accel merge-weights`` on the save_state folders (1 and 2 processes) gives the weights at the save;
    a crafted pickle planted in one is refused by name before DeepSpeed's reader runs."""
    from safetensors.torch import load_file

    from accel_train.commands.merge import main as merge_main

    for saved_on in (1, 2):
        out = tmp_path / f"merged_{saved_on}"
        assert merge_main([folders[saved_on], str(out)]) == 0, capsys.readouterr().err
        merged = load_file(str(out / "model.safetensors"))
        expected = runs[saved_on][0]["state_at_save"]
        assert merged.keys() == expected.keys()
        for name, value in expected.items():
            assert merged[name].dtype == torch.float32
            torch.testing.assert_close(merged[name], value, atol=0, rtol=0)
    marker = tmp_path / "marker"
    tag = os.path.join(folders[2], "pytorch_model")
    planted = next(n for n in sorted(os.listdir(tag)) if "model_states" in n)
    torch.save({"module": _Exploit(str(marker))}, os.path.join(tag, planted))
    capsys.readouterr()
    assert merge_main([folders[2], str(tmp_path / "merged_crafted")]) == 2
    error = capsys.readouterr().err
    assert planted in error and "GLOBAL builtins.exec" in error, error
    assert not marker.exists() and not (tmp_path / "merged_crafted").exists()


# -- offload: DeepSpeed's files with offloaded optimizer / parameters pass the allow-list, a crafted one not --


class _Exploit:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


def rank_offload(stage: int, folder: str, marker: str) -> dict:
    """Train, save and load back with CPU offload (no false refusal: the state comes back); then plant a
    crafted pickle in the optimizer partition of rank 0 and load again."""
    reset_shared_state()
    from accel_train import Accelerator, DeepSpeedPlugin

    zero: dict = {"stage": stage, "offload_optimizer": {"device": "cpu"}}
    if stage == 3:
        zero.update(offload_param={"device": "cpu"}, stage3_gather_16bit_weights_on_model_save=True)
    config = {
        "zero_optimization": zero,
        # torch's AdamW on the offloaded partitions: no DeepSpeedCPUAdam to compile for this test (its files
        # are the same kind; the DeepSpeedCPUAdam path trains in test_train_deepspeed_distributed.py).
        "zero_force_ds_cpu_optimizer": False,
        "gradient_clipping": 0.0,
        "gradient_accumulation_steps": 1,
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
    }
    plugin = DeepSpeedPlugin(hf_ds_config=config)
    accelerator = Accelerator(deepspeed_plugin=plugin)
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(regression_dataset(16), batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    def state() -> dict:
        return {k: v.detach().float().clone() for k, v in accelerator.get_state_dict(model).items()}

    train_epoch(accelerator, model, optimizer, loader)
    saved = state()
    accelerator.save_state(folder)
    train_epoch(accelerator, model, optimizer, loader)
    trained_on = state()
    accelerator.load_state(folder)  # DeepSpeed's own offload checkpoint: must load
    back = state()
    tag = os.path.join(folder, "pytorch_model")
    files = sorted(os.listdir(tag))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        name = next(n for n in files if "optim_states" in n)
        torch.save({"optimizer_state_dict": _Exploit(marker)}, os.path.join(tag, name))
    accelerator.wait_for_everyone()
    train_epoch(accelerator, model, optimizer, loader)
    before = state()
    error = ""
    try:
        accelerator.load_state(folder)
    except Exception as raised:
        error = f"{type(raised).__name__}: {raised}"
    after = state()
    device = model.zero_offload_optimizer().device
    reset_shared_state()
    return {
        "offload": (str(getattr(device, "value", device)), model.zero_offload_param() is not None),
        "restored": all(torch.equal(back[k], saved[k]) for k in saved),
        "moved": any(not torch.equal(trained_on[k], saved[k]) for k in saved),
        "files": files,
        "error": error,
        "unchanged": all(torch.equal(before[k], after[k]) for k in before),
        "ran": os.path.exists(marker),
    }


@pytest.mark.parametrize("stage", [2, 3])
def test_offload_checkpoint_loads_and_a_crafted_file_in_it_is_refused(pools, tmp_path, stage: int) -> None:
    marker = str(tmp_path / "marker")
    results = pools(2).run(rank_offload, stage, str(tmp_path / "ckpt"), marker)
    for result in results:
        assert result["offload"] == ("cpu", stage == 3)
        assert result["moved"] and result["restored"], result
        assert result["error"].startswith("UnsafeCheckpointError"), result["error"]
        assert "optim_states.pt" in result["error"] and "GLOBAL builtins.exec" in result["error"]
        assert result["unchanged"] and not result["ran"]
    assert not os.path.exists(marker)
