"""The tracker contract, the registry, log_with resolution, the JSON-lines tracker and failure isolation."""

from __future__ import annotations

import json
import math
import sys
import warnings
from typing import Any

import pytest
import torch

import accel_tracking
from accel_tracking import (
    LOGGER_TYPE_TO_CLASS,
    GeneralTracker,
    JSONLTracker,
    LoggerType,
    TrackerError,
    filter_trackers,
    finish_all,
    get_available_trackers,
    log_to_all,
    on_main_process,
    read_jsonl,
    register_tracker_class,
)
from accel_tracking import general as general_module

BACKENDS = ["tensorboard", "wandb", "comet_ml", "aim", "mlflow", "clearml", "dvclive", "trackio", "swanlab"]


class ListTracker(GeneralTracker):
    """A custom tracker as a user writes it: keeps what it receives."""

    name = "list_tracker"
    requires_logging_directory = False

    def __init__(self, run_name: str = "run", **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        self.kwargs = kwargs
        self.config: dict | None = None
        self.logged: list[tuple[dict, int | None, dict]] = []
        self.finished = 0

    @property
    def tracker(self) -> list:
        return self.logged

    @on_main_process
    def store_init_configuration(self, values: dict) -> None:
        self.config = values

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        self.logged.append((values, step, kwargs))

    @on_main_process
    def finish(self) -> None:
        self.finished += 1


class BrokenTracker(ListTracker):
    name = "broken"

    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        raise ConnectionError("backend unreachable")

    def finish(self) -> None:
        raise OSError("disk full")


def test_import_is_cheap_and_imports_no_backend() -> None:
    import subprocess

    code = (
        "import sys, accel_tracking, accel_tracking.tracking\n"
        "heavy = {'torch', 'wandb', 'mlflow', 'aim', 'tensorboard', 'clearml', 'dvclive', 'trackio', 'swanlab', 'comet_ml'}\n"
        "print(sorted(heavy & {m.split('.')[0] for m in sys.modules}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_logger_type_values_and_membership() -> None:
    assert LoggerType.list() == [
        "all",
        "aim",
        "tensorboard",
        "wandb",
        "trackio",
        "comet_ml",
        "mlflow",
        "clearml",
        "dvclive",
        "swanlab",
        "jsonl",
    ]
    assert "wandb" in LoggerType and LoggerType.WANDB in LoggerType and "nope" not in LoggerType
    assert str(LoggerType.COMETML) == "comet_ml" and LoggerType("tensorboard") == "tensorboard"
    assert set(LOGGER_TYPE_TO_CLASS) == set(LoggerType.list()) - {"all"}


def test_general_tracker_names_missing_attributes() -> None:
    class Incomplete(GeneralTracker):
        name = "incomplete"

    with pytest.raises(NotImplementedError, match="`requires_logging_directory`, `tracker`"):
        Incomplete()
    blank = GeneralTracker(_blank=True)
    assert blank.tracker is None
    assert blank.log({"a": 1}) is None and blank.finish() is None


def test_register_tracker_class_makes_a_name_usable() -> None:
    assert register_tracker_class(ListTracker) is ListTracker
    assert LOGGER_TYPE_TO_CLASS["list_tracker"] is ListTracker
    assert filter_trackers(["list_tracker", "list_tracker"]) == ["list_tracker"]
    # beside "all": kept, and the built-ins that are installed come too
    assert "list_tracker" in filter_trackers(["all", "list_tracker"])


def test_register_tracker_class_rejects_bad_classes() -> None:
    with pytest.raises(TypeError, match="subclass of GeneralTracker"):
        register_tracker_class(dict)  # type: ignore[arg-type]
    # the documented system raises ValueError here: the same error is both
    with pytest.raises(ValueError, match="subclass of GeneralTracker"):
        register_tracker_class(ListTracker())  # type: ignore[arg-type]

    class NoName(GeneralTracker):
        requires_logging_directory = False

    with pytest.raises(ValueError, match="non-empty string `name`"):
        register_tracker_class(NoName)

    class NoDir(GeneralTracker):
        name = "nodir"

    with pytest.raises(ValueError, match="requires_logging_directory"):
        register_tracker_class(NoDir)

    class All(ListTracker):
        name = "all"

    with pytest.raises(ValueError, match="reserved"):
        register_tracker_class(All)


def test_register_twice_warns() -> None:
    register_tracker_class(ListTracker)

    class Other(ListTracker):
        pass

    with pytest.warns(UserWarning, match="replaces it"):
        register_tracker_class(Other)
    assert LOGGER_TYPE_TO_CLASS["list_tracker"] is Other


def test_filter_trackers_names_instances_and_all(tmp_path) -> None:
    custom = ListTracker()
    assert filter_trackers(None) == []
    assert filter_trackers(custom) == [custom]
    assert filter_trackers([LoggerType.JSONL, "JSONL", custom, custom], tmp_path) == ["jsonl", custom]
    everything = filter_trackers(["all", custom], tmp_path)
    assert everything[0] is custom
    assert everything[1:] == [str(t) for t in get_available_trackers()]
    assert "jsonl" in everything
    # without a directory "all" leaves out the trackers that need one
    assert "jsonl" not in filter_trackers("all")
    assert "tensorboard" not in filter_trackers("all")


def test_filter_trackers_errors_name_the_problem(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"Unsupported tracker 'tensorbord'.*'tensorboard'"):
        filter_trackers("tensorbord")
    with pytest.raises(
        ValueError, match=r"Logging with `jsonl` requires a `logging_dir` to be passed in: pass `project_dir=...`"
    ):
        filter_trackers("jsonl")
    with pytest.raises(TypeError, match="got the class ListTracker"):
        filter_trackers([ListTracker])
    with pytest.raises(TypeError, match="got int"):
        filter_trackers([3])


def test_missing_backend_error_names_the_extra(monkeypatch) -> None:
    monkeypatch.setattr(general_module, "is_backend_available", lambda extra: False)
    from accel_tracking import registry

    monkeypatch.setattr(registry, "is_backend_available", lambda extra: False)
    with pytest.raises(
        ImportError, match=r'pip install -c tools/constraints.txt "\./packages/accel-tracking\[wandb\]"'
    ):
        accel_tracking.WandBTracker("project")
    with pytest.raises(
        ImportError, match=r'pip install -c tools/constraints.txt "\./packages/accel-tracking\[mlflow\]"'
    ):
        filter_trackers("mlflow")
    assert get_available_trackers() == [LoggerType.JSONL]


@pytest.mark.parametrize("backend", BACKENDS)
def test_absent_backend_is_a_clear_error(backend: str, tmp_path) -> None:
    from accel_tracking.general import is_backend_available

    if is_backend_available(backend):
        pytest.skip(
            f"{backend} is installed here (the error path is covered by test_missing_backend_error_names_the_extra)"
        )
    cls = LOGGER_TYPE_TO_CLASS[backend]
    args = ("project", str(tmp_path)) if cls.requires_logging_directory else ("project",)
    with pytest.raises(ImportError, match=rf'"\./packages/accel-tracking\[{backend}\]"'):
        cls(*args)
    with pytest.raises(ImportError, match=rf"accel-tracking\[{backend}\]"):
        filter_trackers(backend, tmp_path)


def test_jsonl_tracker_writes_config_then_one_line_per_log(tmp_path) -> None:
    np = pytest.importorskip("numpy")
    tracker = JSONLTracker("my run/1", tmp_path / "logs")
    assert tracker.name == "jsonl" and tracker.requires_logging_directory and tracker.main_process_only
    tracker.store_init_configuration({"lr": torch.tensor(0.5), "layers": [1, 2], "none": None, "n": {"a": {}}})
    tracker.log({"loss": torch.tensor(1.5), "acc": np.float32(0.25), "note": "hi"}, step=0)
    tracker.log({"loss": math.nan, "big": math.inf}, step=torch.tensor(1))
    tracker.log({"loss": 0.5})
    path = tracker.path
    assert path is not None and path.endswith("my_run_1.jsonl")
    tracker.finish()
    tracker.finish()  # idempotent
    records = list(read_jsonl(path))
    assert [r["event"] for r in records] == ["config", "log", "log", "log"]
    assert records[0]["values"] == {"lr": 0.5, "layers": [1, 2], "none": None, "n": {"a": {}}}
    assert records[1]["step"] == 0 and records[1]["values"] == {"loss": 1.5, "acc": 0.25, "note": "hi"}
    assert records[2]["step"] == 1 and records[2]["values"] == {"loss": "NaN", "big": "Infinity"}
    assert records[3]["step"] is None
    for line in open(path, encoding="utf-8"):
        json.loads(line, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    with pytest.raises(RuntimeError, match="jsonl tracker of run 'my run/1' is finished"):
        tracker.log({"loss": 1.0})


def test_jsonl_tracker_new_file_per_run_unless_resumed(tmp_path) -> None:
    first = JSONLTracker("run", tmp_path)
    first.log({"a": 1}, step=0)
    first.finish()
    second = JSONLTracker("run", tmp_path)
    second.log({"a": 2}, step=0)
    second.finish()
    assert first.path != second.path and second.path.endswith("run-1.jsonl")
    resumed = JSONLTracker("run", tmp_path, resume=True)
    resumed.log({"a": 3}, step=1)
    resumed.finish()
    assert [r["values"]["a"] for r in read_jsonl(first.path)] == [1, 3]


def test_jsonl_tracker_bad_arguments(tmp_path) -> None:
    with pytest.raises(ValueError, match="pass `logging_dir`"):
        JSONLTracker("run", None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"unknown arguments: \['flush_secs'\]"):
        JSONLTracker("run", tmp_path, flush_secs=3)
    tracker = JSONLTracker("run", tmp_path)
    with pytest.raises(TypeError, match="values to log must be a dict"):
        tracker.log([1.0], step=0)  # type: ignore[arg-type]
    tracker.finish()


def test_tracker_property_is_the_backend_run(tmp_path) -> None:
    tracker = JSONLTracker("run", tmp_path)
    run = tracker.tracker
    assert run.path == tracker.path and not run.closed
    tracker.finish()
    assert tracker.tracker is run and run.closed
    # finishing a tracker that never started does nothing
    JSONLTracker("never", tmp_path).finish()
    assert not (tmp_path / "never.jsonl").exists()


def test_log_to_all_isolates_a_failing_tracker(tmp_path, caplog) -> None:
    good = ListTracker()
    broken = BrokenTracker()
    jsonl = JSONLTracker("run", tmp_path)
    with pytest.raises(TrackerError) as info:
        log_to_all([good, broken, jsonl], {"loss": torch.tensor(2.0)}, step=3, log_kwargs={"list_tracker": {"x": 1}})
    error = info.value
    assert "broken" in str(error) and "ConnectionError: backend unreachable" in str(error)
    assert list(error.failures) == ["broken"] and error.succeeded == ["list_tracker", "jsonl"]
    assert isinstance(error.__cause__, ConnectionError)
    assert good.logged == [({"loss": 2.0}, 3, {"x": 1})]
    jsonl.finish()
    assert [r["values"] for r in read_jsonl(jsonl.path)] == [{"loss": 2.0}]
    assert "Tracker broken failed in log" in caplog.text

    failures = log_to_all([broken, good], {"loss": 1.0}, step=4, raise_errors=False)
    assert list(failures) == ["broken"] and good.logged[-1][1] == 4
    assert log_to_all([good], {"a": 1}) == {}


def test_each_tracker_gets_its_own_copy_of_the_values() -> None:
    class Mutating(ListTracker):
        name = "mutating"

        def log(self, values, step=None, **kwargs):
            values["loss"] = -1
            super().log(values, step, **kwargs)

    first, second = Mutating(), ListTracker()
    log_to_all([first, second], {"loss": 1.0})
    assert second.logged[0][0] == {"loss": 1.0}


def test_log_kwargs_must_be_a_mapping() -> None:
    with pytest.raises(TypeError, match="log_kwargs must map a tracker name"):
        log_to_all([ListTracker()], {"a": 1}, log_kwargs=[("wandb", {})])  # type: ignore[arg-type]


def test_finish_all_finishes_everyone_and_names_the_failure(tmp_path) -> None:
    good, broken = ListTracker(), BrokenTracker()
    jsonl = JSONLTracker("run", tmp_path)
    jsonl.log({"a": 1})
    with pytest.raises(TrackerError, match=r"failed in finish: broken[\s\S]*OSError: disk full"):
        finish_all([good, broken, jsonl])
    assert good.finished == 1 and jsonl.tracker.closed
    finish_all([jsonl])  # idempotent


def test_same_names_are_told_apart_in_reports() -> None:
    with pytest.raises(TrackerError) as info:
        log_to_all([BrokenTracker(), BrokenTracker()], {"a": 1})
    assert list(info.value.failures) == ["broken", "broken#2"]


def test_on_main_process_runs_on_the_single_process() -> None:
    tracker = ListTracker()
    tracker.log({"a": 1}, step=0)
    assert tracker.logged == [({"a": 1}, 0, {})]


def test_custom_tracker_of_the_guide_works_through_the_decorator() -> None:
    class GuideTracker(GeneralTracker):
        name = "guide"
        requires_logging_directory = False

        @on_main_process
        def __init__(self, run_name: str) -> None:
            self.run_name = run_name
            self.run: list = []

        @property
        def tracker(self):
            return self.run

        @on_main_process
        def store_init_configuration(self, values: dict) -> None:
            self.run.append(("config", values))

        @on_main_process
        def log(self, values: dict, step: int | None = None) -> None:
            self.run.append((step, values))

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tracker = GuideTracker("some_run_name")
    assert filter_trackers([tracker, "all"])[0] is tracker
    tracker.store_init_configuration({"lr": 1})
    log_to_all([tracker], {"loss": 0.5}, step=1)
    assert tracker.tracker == [("config", {"lr": 1}), (1, {"loss": 0.5})]


def test_step_may_be_a_tensor_but_must_be_an_integer(tmp_path) -> None:
    np = pytest.importorskip("numpy")
    good = ListTracker()
    log_to_all([good], {"a": 1}, step=torch.tensor(4))
    log_to_all([good], {"a": 1}, step=np.int64(5))
    assert [s for _, s, _ in good.logged] == [4, 5] and all(type(s) is int for _, s, _ in good.logged)
    tracker = JSONLTracker("run", tmp_path)
    for bad in ("3", 1.5, True, [1]):
        with pytest.raises(TypeError, match="`step` must be an integer"):
            log_to_all([good, tracker], {"a": 1}, step=bad)
        with pytest.raises(TypeError, match="`step` must be an integer"):
            tracker.log({"a": 1}, step=bad)
    assert len(good.logged) == 2  # nothing logged with a bad step
    tracker.log({"a": 1}, step=2.0)
    tracker.finish()
    assert [r["step"] for r in read_jsonl(tracker.path)] == [2]


def test_skipped_values_warn_once_per_key(tmp_path, caplog) -> None:
    from accel_tracking.general import BackendTracker

    class NumbersOnly(BackendTracker):
        name = "numbers_only"
        requires_logging_directory = False

        def _start(self):
            return []

        def _store_config(self, config):
            self._run.append(config)

        def _log(self, values, step, **kwargs):
            for key, value in values.items():
                if isinstance(value, str):
                    self._skip(key, value, "numbers only")
                else:
                    self._run.append((step, key, value))

    tracker = NumbersOnly("run")
    for step in range(3):
        tracker.log({"loss": 1.0, "note": "text"}, step=step)
    assert caplog.text.count("skipped 'note'") == 1
    assert [entry for entry in tracker.tracker] == [(0, "loss", 1.0), (1, "loss", 1.0), (2, "loss", 1.0)]


def test_tensorboard_without_a_directory_is_a_clear_error() -> None:
    from accel_tracking import TensorBoardTracker

    with pytest.raises(ValueError, match="tensorboard tracker writes into a directory"):
        TensorBoardTracker("run", None)  # type: ignore[arg-type]
