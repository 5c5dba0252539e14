"""The main job: examples/train_demo.py through the real ``accel launch`` on two CPU processes."""

from __future__ import annotations

import json
import os
import pathlib

from conftest import ROOT, accel_command, run_command


def test_train_demo_on_two_processes(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "demo"
    result = run_command(
        [
            *accel_command(),
            "launch",
            "--cpu",
            "--num_processes",
            "2",
            str(ROOT / "examples" / "train_demo.py"),
            "--output_dir",
            str(out),
        ],
        timeout=600,
    )
    text = result.stdout + result.stderr
    assert result.returncode == 0, text[-4000:]
    assert "2 process(es), MULTI_CPU" in text and "mixed precision bf16" in text
    assert "checkpoint saved mid-epoch" in text and "parameters identical" in text
    assert "each counted once" in text and "outputs match" in text
    epochs = [line for line in text.splitlines() if line.startswith("epoch ") and "mean loss" in line]
    losses = [float(line.split("mean loss ")[1].split(",")[0]) for line in epochs]
    assert len(losses) == 3 and losses[-1] < losses[0]
    (run,) = list(out.iterdir())  # one folder per run
    assert os.listdir(run / "checkpoints") == ["checkpoint_0"]
    assert {"random_states_0.safetensors", "random_states_1.safetensors", "model.safetensors"} <= set(
        os.listdir(run / "checkpoints" / "checkpoint_0")
    )
    assert (run / "model" / "model.safetensors.index.json").is_file()
    logs = list(run.glob("train_demo.jsonl"))
    assert len(logs) == 1 and f"logs: {logs[0]}" in text
    records = [json.loads(line) for line in logs[0].read_text().splitlines()]
    assert records[0]["event"] == "config" and any("eval_accuracy" in r.get("values", {}) for r in records)
