"""Every tracker against its real library, offline or local, read back from what the library wrote.

Marked ``trackers``: ``nox -s trackers`` installs every backend and runs them. Without a backend the
test skips and says which extra would run it. Nothing here touches the network.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from typing import Any

import pytest
import torch

from accel_state.install_hints import install_hint
from accel_tracking import (
    AimTracker,
    ClearMLTracker,
    CometMLTracker,
    DVCLiveTracker,
    MLflowTracker,
    SwanLabTracker,
    TensorBoardTracker,
    TrackioTracker,
    WandBTracker,
)
from accel_tracking.general import BackendTracker, is_backend_available

pytestmark = pytest.mark.trackers

CONFIG = {
    "lr": torch.tensor(0.5),
    "layers": [64, 32],
    "scheduler": None,
    "optim": {"name": "adamw", "betas": [0.9, 0.99], "eps": 1e-8},
    "epochs": 3,
    "tag": "baseline",
}
LOSSES = [2.0, 1.5, 1.25]
ACCS = [0.25, 0.5, 0.75]


def image() -> Any:
    np = pytest.importorskip("numpy")
    return (np.random.default_rng(0).random((8, 8, 3)) * 255).astype("uint8")


def needs(extra: str) -> None:
    if not is_backend_available(extra):
        pytest.skip(f"{extra} is not installed (nox -s trackers runs it): {install_hint('accel-tracking', extra)}")


def drive(tracker: BackendTracker) -> Any:
    """Config, three steps of tensor/numpy values, then finish twice; returns the backend run."""
    np = pytest.importorskip("numpy")
    tracker.store_init_configuration(CONFIG)
    for step, (loss, acc) in enumerate(zip(LOSSES, ACCS)):
        tracker.log({"loss": torch.tensor(loss), "acc": np.float32(acc)}, step=step)
    run = tracker.tracker
    tracker.finish()
    tracker.finish()
    with pytest.raises(RuntimeError, match="is finished"):
        tracker.log({"loss": 0.0}, step=9)
    return run


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    return tmp_path


def test_tensorboard(in_tmp) -> None:
    needs("tensorboard")
    yaml = pytest.importorskip("yaml")  # part of the tensorboard extra
    from tensorboard.backend.event_processing import plugin_event_accumulator
    from tensorboard.plugins.hparams import plugin_data_pb2
    from tensorboard.util import tensor_util

    tracker = TensorBoardTracker("proj", in_tmp / "logs", flush_secs=1)
    tracker.log({"note": "hello", "grp": {"a": 1.0, "b": 2.0}}, step=5)
    tracker.log_images({"samples": torch.rand(2, 3, 4, 4)}, step=1)
    assert type(drive(tracker)).__name__ == "SummaryWriter"
    run_dir = in_tmp / "logs" / "proj"
    # As the documented system: YAML in a folder named by the time of storing, under the run's folder.
    (stored,) = glob.glob(str(run_dir / "*" / "hparams.yml"))
    assert float(os.path.basename(os.path.dirname(stored))) == pytest.approx(time.time(), abs=600)
    text = open(stored, encoding="utf-8").read()
    assert text.startswith("epochs: 3\nlayers:\n- 64\n- 32\nlr: 0.5\noptim:\n")  # block style, keys sorted
    assert yaml.safe_load(text) == {**CONFIG, "lr": 0.5}
    assert not (run_dir / "hparams.json").exists()
    acc = plugin_event_accumulator.EventAccumulator(str(run_dir))
    acc.Reload()
    for name, expected in (("loss", LOSSES), ("acc", ACCS)):
        events = acc.Tensors(name)
        assert [e.step for e in events] == [0, 1, 2]
        assert [float(tensor_util.make_ndarray(e.tensor_proto)) for e in events] == pytest.approx(expected)
    assert "note/text_summary" in acc.Tags()["tensors"]
    assert "samples" in acc.Tags()["tensors"]  # images are tensor summaries of the image plugin
    start = plugin_data_pb2.HParamsPluginData.FromString(
        acc.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    ).session_start_info.hparams
    assert start["lr"].number_value == pytest.approx(0.5)
    assert start["optim/name"].string_value == "adamw"
    assert json.loads(start["optim/betas"].string_value) == [0.9, 0.99]
    assert start["scheduler"].string_value == "None"
    assert start["layers"].string_value == "[64, 32]"
    assert sorted(os.listdir(run_dir / "grp_a")) and sorted(os.listdir(run_dir / "grp_b"))


def test_tensorboard_without_pyyaml_names_the_extra_and_stores_nothing(in_tmp, monkeypatch) -> None:
    needs("tensorboard")
    tracker = TensorBoardTracker("proj", in_tmp / "logs")
    tracker.start()
    monkeypatch.setitem(sys.modules, "yaml", None)  # PyYAML not installed
    with pytest.raises(ImportError, match=r'hparams\.yml with PyYAML.*"\./packages/accel-tracking\[tensorboard\]"'):
        tracker.store_init_configuration({"lr": 0.1})
    tracker.finish()
    assert not glob.glob(str(in_tmp / "logs" / "proj" / "*" / "hparams.yml"))
    assert [entry.name for entry in (in_tmp / "logs" / "proj").iterdir() if entry.is_dir()] == []


_WANDB_READER = r"""
import json, struct, sys
from wandb.proto import wandb_internal_pb2

data = open(sys.argv[1], "rb").read()
assert data[:4] == b":W&B", data[:7]
out, pos, block, pending = [], 7, 32768, b""
while pos + 7 <= len(data):
    left = block - pos % block
    if left < 7:
        pos += left
        continue
    _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
    pos += 7
    if kind == 0 and length == 0:
        break
    chunk, pos = data[pos : pos + length], pos + length
    if kind not in (1, 4):
        pending += chunk
        continue
    record = wandb_internal_pb2.Record()
    record.ParseFromString(pending + chunk)
    pending = b""
    which = record.WhichOneof("record_type")
    row = {"kind": which}
    if which == "run":
        row["project"] = record.run.project
    elif which == "config":
        row["items"] = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.config.update}
    elif which == "history":
        row["items"] = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
        row["step"] = record.history.step.num
    out.append(row)
print(json.dumps(out))
"""


def _wandb_records(path: str) -> list[dict[str, Any]]:
    """The records of a W&B transaction log (the ``.wandb`` file of an offline run: LevelDB-log framing).

    Decoded in a fresh interpreter: once tensorboard's protobuf modules are loaded in this process,
    wandb's messages no longer decode reliably here.
    """
    done = subprocess.run([sys.executable, "-c", _WANDB_READER, path], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def test_wandb_offline(in_tmp, monkeypatch) -> None:
    needs("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DISABLE_CODE", "true")
    tracker = WandBTracker("proj", dir=str(in_tmp), name="run-1")
    tracker.log_images({"samples": [image(), image()]}, step=0)
    tracker.log_table("preds", columns=["id", "label"], data=[[1, "cat"], [2, "dog"]], step=0)
    run = drive(tracker)
    (run_dir,) = glob.glob(str(in_tmp / "wandb" / "offline-run-*"))
    assert glob.glob(os.path.join(run_dir, "files", "media", "images", "samples_0_*.png"))
    (table_file,) = glob.glob(os.path.join(run_dir, "files", "media", "table", "preds_0_*.table.json"))
    table = json.load(open(table_file))
    assert table["columns"] == ["id", "label"] and table["data"] == [[1, "cat"], [2, "dog"]]
    assert type(run).__name__ == "Run"
    (path,) = glob.glob(str(in_tmp / "wandb" / "offline-run-*" / "*.wandb"))
    config, history, project = {}, [], None
    for record in _wandb_records(path):
        if record["kind"] == "run":
            project = record["project"]
        elif record["kind"] == "config":
            config.update(record["items"])
        elif record["kind"] == "history":
            history.append({**record["items"], "_step": record["step"]})
    assert project == "proj"
    assert config["lr"] == pytest.approx(0.5) and config["scheduler"] is None
    assert config["optim"] == {"name": "adamw", "betas": [0.9, 0.99], "eps": 1e-8}
    assert [h["_step"] for h in history] == [0, 1, 2]
    assert [h["loss"] for h in history] == pytest.approx(LOSSES)
    assert [h["acc"] for h in history] == pytest.approx(ACCS)


def test_comet_offline_archive(in_tmp, monkeypatch) -> None:
    needs("comet_ml")
    if "comet_ml" not in sys.modules:
        monkeypatch.delenv("COMET_ERROR_TRACKING_ENABLE", raising=False)
    monkeypatch.setenv("COMET_OFFLINE_DIRECTORY", str(in_tmp / "comet"))
    monkeypatch.setenv("COMET_AUTO_LOG_ENV_DETAILS", "false")
    monkeypatch.setenv("COMET_AUTO_LOG_GIT_METADATA", "false")
    monkeypatch.setenv("COMET_AUTO_LOG_GIT_PATCH", "false")
    monkeypatch.setenv("COMET_AUTO_LOG_CO2", "false")
    tracker = CometMLTracker("proj", online=False)
    tracker.log({"note": "hello"}, step=0)
    run = drive(tracker)
    assert type(run).__name__ == "OfflineExperiment"
    import comet_ml.error_tracking

    assert not comet_ml.error_tracking.enabled_in_config()  # offline: no error reports over the network
    (archive,) = glob.glob(str(in_tmp / "comet" / "*.zip"))
    with zipfile.ZipFile(archive) as zipped:
        experiment = json.loads(zipped.read("experiment.json"))
        messages = [json.loads(line) for line in zipped.read("messages.json").decode().splitlines()]
    assert experiment["project_name"] == "proj"
    params, metrics, others = {}, {}, {}
    for message in messages:
        payload = message.get("payload", {})
        if message["type"] == "parameter_msg":
            param = payload.get("param") or payload.get("params")
            if param["source"] == "manual":
                params[param["paramName"]] = param["paramValue"]
        elif message["type"] == "metric_msg":
            metric = payload["metric"]
            metrics.setdefault(metric["metricName"], []).append((metric["step"], metric["metricValue"]))
        elif message["type"] == "log_other":
            others[payload["key"]] = payload["value"]
    assert params["lr"] == pytest.approx(0.5) and params["optim|name"] == "adamw"
    assert params["optim|betas"] == [0.9, 0.99] and params["scheduler"] is None
    assert [s for s, _ in metrics["loss"]] == [0, 1, 2]
    assert [v for _, v in metrics["loss"]] == pytest.approx(LOSSES)
    assert [v for _, v in metrics["acc"]] == pytest.approx(ACCS)
    assert others.get("note") == "hello"


def test_aim_local_repo(in_tmp) -> None:
    needs("aim")
    import aim

    tracker = AimTracker("my-run", in_tmp / "aim", system_tracking_interval=None, capture_terminal_logs=False)
    tracker.log({"note": "hello"}, step=0)
    tracker.log_images({"samples": (image(), "a caption")}, step=1)
    run_hash = tracker.tracker.hash
    assert isinstance(drive(tracker), aim.Run)
    repo = aim.Repo.from_path(str(in_tmp / "aim"))
    repo._recreate_index()  # what `aim up` does when it starts
    run = repo.get_run(run_hash)
    assert run.name == "my-run"
    hparams = run["hparams"]
    assert hparams["lr"] == pytest.approx(0.5) and hparams["scheduler"] is None
    assert hparams["optim"]["betas"] == [0.9, 0.99] and hparams["layers"] == [64, 32]
    metrics = {m.name: m for m in run.metrics()}
    assert list(metrics["loss"].values.values_list()) == pytest.approx(LOSSES)
    assert list(metrics["acc"].values.values_list()) == pytest.approx(ACCS)
    assert [s for s, _ in metrics["loss"].data.items()] == [0, 1, 2]
    from aim.storage.context import Context

    assert [s for s, _ in run.get_image_sequence("samples", Context({})).data.items()] == [1]


def test_mlflow_local_file_store(in_tmp, monkeypatch) -> None:
    needs("mlflow")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    from mlflow.tracking import MlflowClient

    tracker = MLflowTracker("proj", logging_dir=in_tmp / "mlruns", run_name="run-1", tags={"team": "a"})
    tracker.log({"note": "text is skipped"}, step=0)
    run = drive(tracker)
    assert type(run).__name__ == "ActiveRun"
    assert os.environ["MLFLOW_ALLOW_FILE_STORE"] == "true"
    client = MlflowClient(f"file://{in_tmp / 'mlruns'}")
    stored = client.get_run(run.info.run_id)
    assert stored.info.status == "FINISHED" and stored.info.run_name == "run-1"
    assert client.get_experiment(stored.info.experiment_id).name == "proj"
    params = stored.data.params
    assert float(params["lr"]) == 0.5 and params["optim/name"] == "adamw"
    assert json.loads(params["optim/betas"]) == [0.9, 0.99] and params["scheduler"] == "None"
    assert stored.data.tags["team"] == "a"
    for name, expected in (("loss", LOSSES), ("acc", ACCS)):
        history = sorted(client.get_metric_history(run.info.run_id, name), key=lambda m: m.step)
        assert [m.step for m in history] == [0, 1, 2]
        assert [m.value for m in history] == pytest.approx(expected)
    local = client.download_artifacts(run.info.run_id, "config.json", str(in_tmp))
    assert json.load(open(local))["optim"]["betas"] == [0.9, 0.99]


def test_mlflow_long_param_is_truncated_not_rejected(in_tmp, monkeypatch) -> None:
    needs("mlflow")
    from mlflow.tracking import MlflowClient
    from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    tracker = MLflowTracker("proj", logging_dir=in_tmp / "mlruns")
    tracker.store_init_configuration({"big": "x" * (MAX_PARAM_VAL_LENGTH + 10), **{f"p{i}": i for i in range(150)}})
    run_id = tracker.tracker.info.run_id
    tracker.finish()
    params = MlflowClient(f"file://{in_tmp / 'mlruns'}").get_run(run_id).data.params
    assert len(params["big"]) == MAX_PARAM_VAL_LENGTH and params["p149"] == "149"


def test_clearml_offline(in_tmp, monkeypatch) -> None:
    needs("clearml")
    import clearml  # imported first: clearml reads CLEARML_OFFLINE_MODE at import, the tracker must still honour it

    assert not clearml.Task.is_offline()
    monkeypatch.setenv("CLEARML_OFFLINE_MODE", "1")
    monkeypatch.setenv("CLEARML_CACHE_DIR", str(in_tmp / "clearml"))
    tracker = ClearMLTracker(
        "proj",
        task_name="run-1",
        auto_connect_frameworks=False,
        auto_resource_monitoring=False,
        auto_connect_streams=False,
        auto_connect_arg_parser=False,
    )
    tracker.log({"final_acc": 0.9})  # no step: a single value
    tracker.log_images({"eval_samples": image()}, step=1)
    tracker.log_table("eval_preds", columns=["id", "label"], data=[[1, "cat"], [2, "dog"]], step=1)
    with pytest.raises(ValueError, match="log_table needs `data` rows"):
        tracker.log_table("empty")
    task = tracker.tracker
    folder = task.get_offline_mode_folder()
    from clearml import Task

    assert drive(tracker) is task and isinstance(task, Task) and Task.is_offline()
    assert Task.current_task() is None or Task.current_task().id != task.id
    task_json = json.loads((folder / "task.json").read_text())
    assert task_json["name"] == "run-1" and task_json["project_name"] == "proj"
    hyper = task_json["hyperparams"]["hyperparameters"]
    assert float(hyper["lr"]["value"]) == 0.5 and hyper["optim/name"]["value"] == "adamw"
    assert json.loads(hyper["optim/betas"]["value"]) == [0.9, 0.99]
    assert "adamw" in task_json["configuration"]["config"]["value"]
    events = [e for line in open(folder / "metrics.jsonl") for e in json.loads(line)]
    scalars = [e for e in events if e.get("type") == "training_stats_scalar"]
    for name, expected in (("loss", LOSSES), ("acc", ACCS)):
        series = sorted((e["iter"], e["value"]) for e in scalars if e["metric"] == name)
        assert [s for s, _ in series] == [0, 1, 2]
        assert [v for _, v in series] == pytest.approx(expected)
    assert any("final_acc" in json.dumps(e) for e in events)
    images = [e for e in events if e.get("type") == "training_debug_image"]
    assert [(e["metric"], e["variant"], e["iter"]) for e in images] == [("eval", "samples", 1)]
    plots = [e for e in events if e.get("type") == "plot"]
    assert [(e["metric"], e["variant"], e["iter"]) for e in plots] == [("eval", "preds", 1)]


def test_dvclive_files_in_a_git_repo_without_commits(in_tmp) -> None:
    needs("dvclive")
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    subprocess.run(["git", "init", "-q", str(in_tmp)], check=True)
    from accel_tracking.trackers.dvclive import git_repo_without_commits

    assert git_repo_without_commits(in_tmp)
    tracker = DVCLiveTracker("proj", dir=str(in_tmp / "dvclive"))
    assert type(drive(tracker)).__name__ == "Live"
    import yaml

    params = yaml.safe_load((in_tmp / "dvclive" / "params.yaml").read_text())
    assert params["lr"] == pytest.approx(0.5) and params["optim"]["betas"] == [0.9, 0.99]
    assert params["scheduler"] is None and params["layers"] == [64, 32]
    for name, expected in (("loss", LOSSES), ("acc", ACCS)):
        lines = (in_tmp / "dvclive" / "plots" / "metrics" / f"{name}.tsv").read_text().splitlines()
        header, rows = lines[0].split("\t"), [dict(zip(lines[0].split("\t"), line.split("\t"))) for line in lines[1:]]
        assert header == ["step", name]
        assert [int(r["step"]) for r in rows] == [0, 1, 2]
        assert [float(r[name]) for r in rows] == pytest.approx(expected)
    metrics = json.loads((in_tmp / "dvclive" / "metrics.json").read_text())
    assert metrics["loss"] == pytest.approx(LOSSES[-1])


def test_trackio_local_storage(in_tmp, monkeypatch) -> None:
    needs("trackio")
    import trackio  # imported first: its directory is read at import, the tracker must still honour ours
    from trackio.sqlite_storage import SQLiteStorage

    store = in_tmp / "trackio"
    monkeypatch.setenv("TRACKIO_DIR", str(store))
    tracker = TrackioTracker("proj", name="run-1", auto_log_cpu=False, auto_log_gpu=False)
    assert isinstance(drive(tracker), trackio.Run)
    assert (store / "proj.db").exists()
    assert trackio.utils.TRACKIO_DIR == store
    config = SQLiteStorage.get_run_config("proj", "run-1")
    assert config["lr"] == pytest.approx(0.5) and config["scheduler"] is None
    assert config["optim"]["betas"] == [0.9, 0.99]
    logs = SQLiteStorage.get_logs("proj", "run-1")
    assert [row["step"] for row in logs] == [0, 1, 2]
    assert [row["loss"] for row in logs] == pytest.approx(LOSSES)
    assert [row["acc"] for row in logs] == pytest.approx(ACCS)


def test_swanlab_offline(in_tmp) -> None:
    needs("swanlab")
    import yaml
    from swanlab.proto.swanlab.record.v1 import record_pb2
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    tracker = SwanLabTracker("proj", name="run-1", mode="offline", log_dir=str(in_tmp / "swanlog"))
    tracker.log_images({"samples": image()}, step=1)
    assert type(drive(tracker)).__name__ == "Run"
    (run_dir,) = glob.glob(str(in_tmp / "swanlog" / "run-*"))
    assert glob.glob(os.path.join(run_dir, "media", "image", "001-*.png"))
    config = yaml.safe_load(open(os.path.join(run_dir, "files", "config.yaml")))
    assert config["lr"]["value"] == pytest.approx(0.5)
    assert config["optim"]["value"]["betas"] == [0.9, 0.99]
    assert config["scheduler"]["value"] == "None"
    (store,) = glob.glob(os.path.join(run_dir, "*.swanlab"))
    reader = DataStoreReader()
    reader.open(store)
    scalars: dict[str, list[tuple[int, float]]] = {}
    project = None
    for data in reader:
        record = record_pb2.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "start":
            project = record.start.project
        elif kind == "scalar":
            scalars.setdefault(record.scalar.key, []).append((record.scalar.step, record.scalar.value.number))
    reader.close()
    assert project == "proj"
    assert [s for s, _ in scalars["loss"]] == [0, 1, 2]
    assert [v for _, v in scalars["loss"]] == pytest.approx(LOSSES)
    assert [v for _, v in scalars["acc"]] == pytest.approx(ACCS)


def test_mlflow_bad_tags_are_a_clear_error(monkeypatch) -> None:
    needs("mlflow")
    monkeypatch.delenv("MLFLOW_TAGS", raising=False)
    with pytest.raises(ValueError, match="MLflow tags must be a dict or its JSON text"):
        MLflowTracker("proj", tags="{not json")
    with pytest.raises(ValueError, match="MLflow tags must be a dict .*got list"):
        MLflowTracker("proj", tags="[1, 2]")
    monkeypatch.setenv("MLFLOW_TAGS", '{"from_env": 1}')
    assert MLflowTracker("proj", tags={"ignored": 2}).tags == {"from_env": "1"}
