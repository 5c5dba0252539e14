"""The collectives demo, end to end: two real processes started by torch.distributed.run."""

from __future__ import annotations

import sys

from conftest import ROOT, run_command


def test_collectives_demo_on_two_processes() -> None:
    result = run_command(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            str(ROOT / "examples" / "collectives_demo.py"),
        ],
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "accel-state demo: 2 process(es), backend gloo, device cpu" in out
    assert "-> [0.0, 0.0, 1.0, 1.0]" in out
    assert "split        range(10) shared as [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]" in out
    assert out.count("all checks passed") == 1  # printed by the main process only
