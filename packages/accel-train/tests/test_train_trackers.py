"""Trackers through the Accelerator: log_with, init_trackers, log, get_tracker, end_training."""

from __future__ import annotations

import json

import pytest
import torch

from accel_train import Accelerator

tracking = pytest.importorskip("accel_tracking.tracking")


class ListTracker(tracking.GeneralTracker):
    name = "list"
    requires_logging_directory = False

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.records: list = []
        self.config = None
        self.finished = False
        self.fail = fail

    @property
    def tracker(self) -> list:
        return self.records

    def store_init_configuration(self, values: dict) -> None:
        self.config = values

    def log(self, values: dict, step: int | None = None, **kwargs) -> None:
        if self.fail:
            raise RuntimeError("backend down")
        self.records.append((step, values, kwargs))

    def finish(self) -> None:
        self.finished = True


def test_custom_and_jsonl_trackers(tmp_path) -> None:
    custom = ListTracker()
    accelerator = Accelerator(cpu=True, log_with=[custom, "jsonl"], project_dir=str(tmp_path))
    accelerator.init_trackers("demo", config={"lr": 0.1}, init_kwargs={"list": {}})
    accelerator.log({"loss": torch.tensor(0.5)}, step=3, log_kwargs={"list": {"commit": True}})
    assert custom.config == {"lr": 0.1}
    assert custom.records == [(3, {"loss": 0.5}, {"commit": True})]
    assert accelerator.get_tracker("list") is custom
    assert accelerator.get_tracker("list", unwrap=True) is custom.records
    with pytest.raises(ValueError, match="not an available tracker"):
        accelerator.get_tracker("wandb")
    accelerator.end_training()
    assert custom.finished
    lines = [json.loads(line) for line in (tmp_path / "demo.jsonl").read_text().splitlines()]
    assert lines[0]["event"] == "config" and lines[0]["values"] == {"lr": 0.1}
    assert lines[1]["step"] == 3 and lines[1]["values"] == {"loss": 0.5}


def test_failing_tracker_is_named_and_others_still_log() -> None:
    good, bad = ListTracker(), ListTracker(fail=True)
    bad.name = "flaky"
    accelerator = Accelerator(cpu=True, log_with=[bad, good])
    accelerator.init_trackers("demo")
    with pytest.raises(tracking.TrackerError, match="flaky"):
        accelerator.log({"loss": 1.0}, step=1)
    assert good.records == [(1, {"loss": 1.0}, {})]


def test_init_kwargs_for_unknown_tracker() -> None:
    accelerator = Accelerator(cpu=True, log_with=[ListTracker()])
    with pytest.raises(ValueError, match=r"init_kwargs names trackers \['wandb'\]"):
        accelerator.init_trackers("demo", init_kwargs={"wandb": {}})


def test_unknown_tracker_name() -> None:
    with pytest.raises(ValueError, match="Unsupported tracker"):
        Accelerator(cpu=True, log_with="nonexistent")
