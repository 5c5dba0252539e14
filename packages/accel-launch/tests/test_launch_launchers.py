"""notebook_launcher and debug_launcher start real processes (CPU, gloo) that form one group."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from accel_launch.launchers import debug_launcher, notebook_launcher
from accel_state.testing import free_port


def report_rank(out_dir: str, scale: float) -> None:
    """Runs in every process: join the group through accel_state, all-reduce, write what it saw."""
    import torch

    from accel_state.operations import reduce
    from accel_state.state import PartialState

    state = PartialState()
    total = reduce(torch.tensor([float(state.process_index + 1) * scale]), reduction="sum")
    record = {
        "rank": state.process_index,
        "world": state.num_processes,
        "backend": state.backend,
        "total": total.item(),
        "pid": os.getpid(),
        "mixed": os.environ.get("ACCELERATE_MIXED_PRECISION"),
    }
    Path(out_dir, f"rank{state.process_index}.json").write_text(json.dumps(record))


def _records(out_dir: Path) -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted(out_dir.glob("rank*.json"))]


def test_notebook_launcher_two_cpu_processes(tmp_path: Path) -> None:
    notebook_launcher(
        report_rank, (str(tmp_path), 2.0), num_processes=2, mixed_precision="bf16", use_port=str(free_port())
    )
    records = _records(tmp_path)
    assert [r["rank"] for r in records] == [0, 1]
    assert all(
        r["world"] == 2 and r["backend"] == "gloo" and r["total"] == 6.0 and r["mixed"] == "bf16" for r in records
    )
    assert len({r["pid"] for r in records} | {os.getpid()}) == 3  # two new processes


def test_debug_launcher_two_cpu_processes(tmp_path: Path) -> None:
    debug_launcher(report_rank, (str(tmp_path), 1.0), num_processes=2)
    records = _records(tmp_path)
    assert [r["rank"] for r in records] == [0, 1]
    assert all(r["world"] == 2 and r["total"] == 3.0 for r in records)


def plain_function(out: str, value: int) -> None:
    Path(out).write_text(f"{os.getpid()} {value} {os.environ.get('ACCELERATE_MIXED_PRECISION')}")


def test_notebook_launcher_one_process_runs_here(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "one.txt"
    notebook_launcher(plain_function, (str(out), 5), num_processes=1, mixed_precision="fp16")
    assert out.read_text() == f"{os.getpid()} 5 fp16"
    assert "Launching training on CPU." in capsys.readouterr().out
    assert "ACCELERATE_MIXED_PRECISION" not in os.environ or os.environ["ACCELERATE_MIXED_PRECISION"] != "fp16"


def test_notebook_launcher_port_in_use(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ConnectionError, match=f"port {port} is already in use"):
            notebook_launcher(plain_function, (str(tmp_path / "x"), 1), num_processes=2, use_port=port)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"mixed_precision": "fp32"}, "mixed_precision"),
        ({"num_processes": 0}, "num_processes"),
        ({"num_nodes": 2, "node_rank": 2}, "node_rank"),
    ],
)
def test_notebook_launcher_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        notebook_launcher(plain_function, ("/dev/null", 1), **kwargs)


def test_debug_launcher_bad_count() -> None:
    with pytest.raises(ValueError, match="num_processes"):
        debug_launcher(plain_function, num_processes=0)
