"""accel-tracking installed without torch: `--no-deps` with accel-state, as the README shows.

The trackers' main-process gate asks ``PartialState`` when torch is there; without it, the launcher's
rank variables decide. Checked in a real venv that has no torch (uv makes one in seconds).
"""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import textwrap

import pytest

from accel_tracking import general

PACKAGES = pathlib.Path(__file__).resolve().parents[2]

LOG_ONE_VALUE = textwrap.dedent(
    """
    import sys
    import accel_tracking
    tracker = accel_tracking.JSONLTracker("run", logging_dir=sys.argv[1])
    tracker.store_init_configuration({"lr": 0.1})
    tracker.log({"loss": 1.5}, step=1)
    tracker.finish()
    assert "torch" not in sys.modules, "accel_tracking imported torch"
    """
)


def test_without_torch_the_launchers_rank_picks_the_main_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(general.importlib.util, "find_spec", lambda name, *a: None if name == "torch" else object())
    for variable in ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK"):
        monkeypatch.delenv(variable, raising=False)
    assert general._is_main_process()
    monkeypatch.setenv("RANK", "1")
    assert not general._is_main_process()
    monkeypatch.setenv("RANK", "0")
    assert general._is_main_process()


@pytest.mark.skipif(shutil.which("uv") is None, reason="needs uv to make a venv without torch")
def test_the_jsonl_tracker_logs_in_a_venv_without_torch(tmp_path: pathlib.Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run(["uv", "venv", "--quiet", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    packages = [str(PACKAGES / "accel-state"), str(PACKAGES / "accel-tracking")]
    install = subprocess.run(
        ["uv", "pip", "install", "--quiet", "--python", python, "--no-deps", *packages],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    assert subprocess.run([python, "-c", "import torch"], capture_output=True, timeout=60).returncode != 0
    script = tmp_path / "log.py"
    script.write_text(LOG_ONE_VALUE)
    for rank in ("0", "1"):
        folder = tmp_path / f"rank{rank}"
        done = subprocess.run(
            [python, str(script), str(folder)], capture_output=True, text=True, timeout=120, env={"RANK": rank}
        )
        assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "rank0" / "run.jsonl").read_text().splitlines()]
    assert {"event": "log", "step": 1, "values": {"loss": 1.5}}.items() <= records[-1].items(), records
    assert not (tmp_path / "rank1").exists() or not any((tmp_path / "rank1").iterdir())
