"""The ``copies`` launch mode: independent processes, none in a process group, stopped together on failure."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from accel_launch.copies import GROUP_VARIABLES, copy_environment, run_copies

GROUP_ENV = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "KEEP": "yes"}


def test_copies_run_without_the_group_variables(tmp_path: Path) -> None:
    script = (
        "import os, sys\n"
        "seen = sorted(k for k in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'LOCAL_WORLD_SIZE') if k in os.environ)\n"
        "open(os.path.join(sys.argv[1], str(os.getpid())), 'w').write(repr((seen, os.environ.get('KEEP'))))\n"
    )
    code, failed = run_copies([sys.executable, "-c", script, str(tmp_path)], GROUP_ENV, 3)
    assert (code, failed) == (0, None)
    assert sorted(path.read_text() for path in tmp_path.iterdir()) == ["([], 'yes')"] * 3
    assert copy_environment(GROUP_ENV) == {"KEEP": "yes"} and "RANK" in GROUP_VARIABLES


def test_a_failing_copy_stops_the_others(tmp_path: Path) -> None:
    # The same command line for both copies: the one that claims the lock file fails, the other would sleep 60 s.
    script = (
        "import os, sys, time\n"
        "try:\n"
        "    os.close(os.open(os.path.join(sys.argv[1], 'lock'), os.O_CREAT | os.O_EXCL))\n"
        "except FileExistsError:\n"
        "    open(os.path.join(sys.argv[1], 'sleeper'), 'w').write(str(os.getpid()))\n"
        "    time.sleep(60)\n"
        "time.sleep(2)\n"  # time for the other copy to start and say who it is
        "sys.exit(5)\n"
    )
    start = time.monotonic()
    code, failed = run_copies([sys.executable, "-c", script, str(tmp_path)], {}, 2, grace_s=5)
    assert code == 5 and failed in (0, 1) and time.monotonic() - start < 30
    sleeper = int((tmp_path / "sleeper").read_text())
    assert not Path(f"/proc/{sleeper}").exists()  # stopped and reaped, not left running


def test_bad_count_and_missing_program_are_named_errors() -> None:
    with pytest.raises(ValueError, match="at least 1 copy, got count=0"):
        run_copies([sys.executable, "-c", "pass"], {}, 0)
    with pytest.raises(FileNotFoundError):
        run_copies(["/nonexistent/program-for-accel-test"], {}, 2)


def test_forward_signal_passes_the_signal_on_to_each_running_child_and_restores() -> None:
    """The launcher's one forwarding helper (single child and copies alike): SIGUSR1 reaches every child
    still running as SIGTERM; the handler it replaced comes back; off the main thread it installs nothing."""
    import signal
    import subprocess
    import sys
    import threading

    from accel_launch.process_guard import forward_signal

    children = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
    try:
        previous = forward_signal(signal.SIGUSR1, children, as_signal=signal.SIGTERM)
        try:
            signal.raise_signal(signal.SIGUSR1)
            codes = [child.wait(timeout=30) for child in children]
        finally:
            signal.signal(signal.SIGUSR1, previous)
        assert codes == [-signal.SIGTERM, -signal.SIGTERM]
        assert signal.getsignal(signal.SIGUSR1) is previous
        off_main: list = []
        thread = threading.Thread(target=lambda: off_main.append(forward_signal(signal.SIGTERM, children)))
        thread.start()
        thread.join()
        assert off_main == [None]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
