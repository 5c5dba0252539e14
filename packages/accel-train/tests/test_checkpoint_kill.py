"""A save killed (SIGKILL, a real process) at its file-system steps over an earlier save: the folder then
loads as the earlier state or the new one, exactly, never a mix. For ``save_state`` of a sharded (DCP)
checkpoint and for ``merge-weights --max_shard_size`` (shards and index). The driver is
``kill_during_save.py``: each kill point is a fresh interpreter (never a fork of a process that ran
torch), two at a time; CI kills at every commit step, its neighbours and a spread of the rest
(``ACCEL_KILL_POINTS=all``, the ``slow`` nox session, at every step)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kill_during_save.py")


@pytest.mark.parametrize("mode", ["save_state", "merge"])
def test_killed_save_leaves_old_or_new_never_a_mix(tmp_path, mode: str) -> None:
    result = subprocess.run([sys.executable, DRIVER, mode, str(tmp_path)], capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    points = report["points"]
    killed = [p for p in points if p["killed"]]
    assert len(killed) >= 10, points
    # every step where the save commits was a kill point
    commits = [p for p in points if any(word in p["step"] for word in ("replace", "rename", "_exchange", "rmtree"))]
    assert commits, points
    outcomes = [p["outcome"] for p in points]
    assert set(outcomes) <= {"old", "new"}, points
    # The previous state until the new one is in place in one step; the new one from then on.
    first_new = outcomes.index("new")
    assert all(o == "old" for o in outcomes[:first_new]) and all(o == "new" for o in outcomes[first_new:])
    assert "old" in outcomes[:first_new] and not points[-1]["killed"]
    assert all(p["killed"] for p in points[:-1]), points
