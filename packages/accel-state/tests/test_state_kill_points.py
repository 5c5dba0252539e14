"""The kill-point helper of the crash-safety tests: which steps are chosen (pure), and real children
(fresh interpreters, never forks) that count their steps, die by SIGKILL at the chosen one, and die with
a driver that is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from accel_state.kill_points import choose_kill_points, run_kill_points

LABELS = [
    "save:before",
    "write:half",
    "write:half",
    "save:after",
    "write:half",
    "os.replace:before",
    "os.replace:after",
    "write:half",
    "write:half",
    "write:half",
    "shutil.rmtree:before",
    "shutil.rmtree:after",
    "write:half",
    "write:half",
]


def test_every_commit_step_and_its_neighbours_are_chosen_within_the_budget() -> None:
    points = choose_kill_points(LABELS, budget=10, every=False)
    assert points == sorted(set(points)) and len(points) == 10
    for commit in (6, 7, 11, 12):  # the replace and the rmtree, before and after
        assert {commit - 1, commit, commit + 1} <= set(points)
    assert 1 in points and all(1 <= p <= len(LABELS) for p in points)


def test_all_points_on_request_or_when_there_are_few(monkeypatch: pytest.MonkeyPatch) -> None:
    assert choose_kill_points(LABELS, budget=5, every=True) == list(range(1, 15))
    assert choose_kill_points(LABELS, budget=40, every=False) == list(range(1, 15))
    monkeypatch.setenv("ACCEL_KILL_POINTS", "all")
    assert choose_kill_points(LABELS, budget=5) == list(range(1, 15))
    monkeypatch.setenv("ACCEL_KILL_POINTS", "")
    assert len(choose_kill_points(LABELS, budget=5)) < 14


def test_commit_points_are_kept_past_the_budget() -> None:
    labels = ["os.replace:before"] * 30
    assert choose_kill_points(labels, budget=3, every=False) == list(range(1, 31))


CHILD = textwrap.dedent(
    """
    import os, sys
    from accel_state.kill_points import StepCounter, die_with_parent
    die_with_parent()
    folder, kill_at, log = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    counter = StepCounter(kill_at, log)
    counter.wrap(os, "replace")
    for index in range(3):
        path = os.path.join(folder, f"f{index}")
        with open(path + ".tmp", "w") as handle:
            handle.write(str(index))
        counter.tick("write")
        os.replace(path + ".tmp", path)
    """
)


def test_children_count_their_steps_and_die_at_the_chosen_one(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    log = tmp_path / "steps.txt"

    def command(kill_at: int) -> list[str]:
        folder = tmp_path / f"run-{kill_at}"
        folder.mkdir()
        return [sys.executable, str(script), str(folder), str(kill_at), str(log)]

    assert run_kill_points(command, [0]) == {0: False}
    labels = log.read_text().splitlines()
    assert labels == ["write", "os.replace:before", "os.replace:after"] * 3
    killed = run_kill_points(command, [1, 2, 3, 9, 10])
    assert killed == {1: True, 2: True, 3: True, 9: True, 10: False}
    assert sorted(os.listdir(tmp_path / "run-2")) == ["f0.tmp"]  # died before the first rename
    assert sorted(os.listdir(tmp_path / "run-3")) == ["f0"]  # died right after it
    assert sorted(os.listdir(tmp_path / "run-10")) == ["f0", "f1", "f2"]


def test_a_child_that_fails_is_an_error_naming_its_point_with_its_output(tmp_path: Path) -> None:
    script = tmp_path / "fails.py"
    script.write_text("import sys\nprint('boom')\nsys.exit(3)\n")
    with pytest.raises(RuntimeError, match="kill point 4 exited with 3:\nboom"):
        run_kill_points(lambda k: [sys.executable, str(script)], [4])
    script.write_text("raise ValueError('bad child')\n")
    with pytest.raises(RuntimeError, match="(?s)kill point 5 exited with 1:.*ValueError: bad child"):
        run_kill_points(lambda k: [sys.executable, str(script)], [5])


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="the zygote forks only where /proc shows its threads")
def test_children_are_forked_from_a_zygote_that_preloaded_torch(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(
        "import os, sys\n"
        "preloaded = 'torch' in sys.modules\n"
        "open(sys.argv[1], 'w').write(f'{preloaded} {os.getppid()} {len(os.listdir(\"/proc/self/task\"))}')\n"
    )
    reports = [tmp_path / f"report-{k}" for k in range(4)]
    assert run_kill_points(lambda k: [sys.executable, str(script), str(reports[k])], range(4)) == dict.fromkeys(
        range(4), False
    )
    seen = [report.read_text().split() for report in reports]
    assert all(preloaded == "True" and threads == "1" for preloaded, _, threads in seen), seen
    assert len({parent for _, parent, _ in seen}) == 1 and int(seen[0][1]) != os.getpid()  # one zygote


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_child_dies_with_its_killed_driver(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    driver = textwrap.dedent(
        f"""
        import subprocess, sys
        child = "import os, time; from accel_state.kill_points import die_with_parent; die_with_parent(); "
        child += "open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
        subprocess.run([sys.executable, "-c", child])
        """
    )
    process = subprocess.Popen([sys.executable, "-c", driver])
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    child = int(pid_file.read_text())
    process.send_signal(signal.SIGKILL)  # as a test runner's timeout does
    process.wait(timeout=30)
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(child):
        os.kill(child, signal.SIGKILL)
        pytest.fail("the child outlived its killed driver")


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie not yet reaped counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False
