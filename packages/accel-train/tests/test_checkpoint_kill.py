"""A save killed (SIGKILL, a real process) at every file-system step over an earlier save: the folder then
loads as the earlier state or the new one, exactly, never a mix. For ``save_state`` of a sharded (DCP)
checkpoint and for ``merge-weights --max_shard_size`` (shards and index). The driver is
``kill_during_save.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kill_during_save.py")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the driver forks a child per kill point")
@pytest.mark.parametrize("mode", ["save_state", "merge"])
def test_killed_save_leaves_old_or_new_never_a_mix(tmp_path, mode: str) -> None:
    result = subprocess.run([sys.executable, DRIVER, mode, str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    points = json.loads(result.stdout.strip().splitlines()[-1])
    killed = [p for p in points if p["killed"]]
    assert len(killed) >= 10, points
    outcomes = [p["outcome"] for p in points]
    assert set(outcomes) <= {"old", "new"}, points
    # The previous state until the new one is in place in one step; the new one from then on.
    first_new = outcomes.index("new")
    assert all(o == "old" for o in outcomes[:first_new]) and all(o == "new" for o in outcomes[first_new:])
    assert "old" in outcomes[:first_new] and not points[-1]["killed"]
