"""The demo's progress bar after a resume starts where the epoch resumes and ends at 100%, no jump."""

from __future__ import annotations

import argparse
import importlib.util
import sys

import pytest
from conftest import ROOT


class RecordingBar:
    def __init__(self, total: int, initial: int) -> None:
        self.total, self.initial, self.n, self.positions = total, initial, initial, [initial]

    def update(self, count: int) -> None:
        self.n += count
        self.positions.append(self.n)

    def set_postfix(self, **_: object) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.fixture
def demo():
    spec = importlib.util.spec_from_file_location("train_demo_for_test", ROOT / "examples" / "train_demo.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def test_resumed_epoch_bar_starts_at_the_resume_batch(demo, tmp_path, monkeypatch) -> None:
    from accel_state.testing import reset_shared_state
    from accel_train import Accelerator

    reset_shared_state()
    bars: list[RecordingBar] = []

    def recording_progress(accelerator, total, description, initial=0):
        bars.append(RecordingBar(total, initial))
        return bars[-1]

    monkeypatch.setattr(demo, "progress", recording_progress)
    args = argparse.Namespace(epochs=2, batch_size=64, gradient_accumulation_steps=1, lr=1e-3, seed=0)
    accelerator = Accelerator(cpu=True)
    model, optimizer, train_loader, _, scheduler = demo.build(accelerator, args)
    state = {"global_step": 0}
    half = len(train_loader) // 2
    demo.train_epoch(accelerator, model, optimizer, train_loader, scheduler, 0, args, stop_after=half, state=state)
    accelerator.save_state(str(tmp_path / "ckpt"))
    accelerator.free_memory()
    model, optimizer, train_loader, _, scheduler = demo.build(accelerator, args)
    accelerator.load_state(str(tmp_path / "ckpt"))
    state["resumed_batches"] = half
    demo.train_epoch(accelerator, model, optimizer, train_loader, scheduler, 0, args, state=state)
    resumed = bars[-1]
    assert resumed.initial == half and resumed.positions[0] == half  # never shown at 0%
    assert resumed.positions == list(range(half, resumed.total + 1))  # one step per batch, ends at 100%
    reset_shared_state()
