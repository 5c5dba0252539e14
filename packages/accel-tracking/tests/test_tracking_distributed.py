"""Two real processes (gloo) logging through the same trackers: one run, written by the main process."""

from __future__ import annotations

import glob
import os
from typing import Any

import pytest

from accel_state.install_hints import install_hint
from accel_tracking.general import is_backend_available


def _log_on_two_ranks(logging_dir: str, tracker_names: list[str]) -> dict[str, Any]:
    from accel_state.state import PartialState
    from accel_tracking import LOGGER_TYPE_TO_CLASS, GeneralTracker, finish_all, log_to_all, on_main_process
    from accel_tracking.dispatch import store_config_to_all

    class PerRank(GeneralTracker):
        name = "per_rank"
        requires_logging_directory = False
        main_process_only = False

        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        @property
        def tracker(self) -> int:
            return self.calls

        @on_main_process
        def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
            self.calls += 1

    state = PartialState()
    assert state.num_processes == 2
    trackers: list[Any] = []
    for name in tracker_names:
        cls = LOGGER_TYPE_TO_CLASS[name]
        trackers.append(cls("shared-run", logging_dir) if cls.requires_logging_directory else cls("shared-run"))
    per_rank = PerRank()
    trackers.append(per_rank)
    for tracker in trackers:
        tracker.start()
    store_config_to_all(trackers, {"world": state.num_processes, "rank": state.process_index})
    for step in range(3):
        log_to_all(trackers, {"loss": 1.0 / (step + 1), "rank": state.process_index}, step=step)
    state.wait_for_everyone()
    runs = {t.name: t.tracker is not None for t in trackers[:-1]}
    finish_all(trackers)
    finish_all(trackers)  # idempotent on both ranks
    state.wait_for_everyone()
    return {"rank": state.process_index, "has_run": runs, "per_rank_calls": per_rank.calls}


def test_two_ranks_write_one_jsonl_run(dist_pool, tmp_path) -> None:
    from accel_tracking import read_jsonl

    results = dist_pool.run(_log_on_two_ranks, str(tmp_path), ["jsonl"])
    assert [r["has_run"] for r in results] == [{"jsonl": True}, {"jsonl": False}]
    assert [r["per_rank_calls"] for r in results] == [3, 3]  # main_process_only=False runs everywhere
    files = glob.glob(str(tmp_path / "*.jsonl"))
    assert [os.path.basename(f) for f in files] == ["shared-run.jsonl"]
    records = list(read_jsonl(files[0]))
    assert [r["event"] for r in records] == ["config", "log", "log", "log"]
    assert records[0]["values"] == {"world": 2, "rank": 0}
    assert [r["step"] for r in records[1:]] == [0, 1, 2]
    assert {r["values"]["rank"] for r in records[1:]} == {0}


@pytest.mark.trackers
def test_two_ranks_write_one_tensorboard_run(dist_pool, tmp_path) -> None:
    if not is_backend_available("tensorboard"):
        pytest.skip(f"tensorboard is not installed: {install_hint('accel-tracking', 'tensorboard')}")
    from tensorboard.backend.event_processing import plugin_event_accumulator
    from tensorboard.util import tensor_util

    results = dist_pool.run(_log_on_two_ranks, str(tmp_path), ["tensorboard", "jsonl"])
    assert [r["has_run"] for r in results] == [
        {"tensorboard": True, "jsonl": True},
        {"tensorboard": False, "jsonl": False},
    ]
    run_dir = tmp_path / "shared-run"
    events = glob.glob(str(run_dir / "events.out.tfevents.*"))
    assert len(events) == 1, events  # one writer: the main process
    acc = plugin_event_accumulator.EventAccumulator(str(run_dir))
    acc.Reload()
    assert [e.step for e in acc.Tensors("loss")] == [0, 1, 2]
    assert {float(tensor_util.make_ndarray(e.tensor_proto)) for e in acc.Tensors("rank")} == {0.0}
    assert len(glob.glob(str(tmp_path / "*.jsonl"))) == 1
