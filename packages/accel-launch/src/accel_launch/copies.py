"""Independent copies of a script: the ``copies`` launch mode.

``accel launch --multi_gpu`` on a machine without a GPU starts its processes the way Hugging Face
Accelerate does there: each one runs on the CPU on its own, with no process group (each is process 0
of 1). This module starts those processes without the torch.distributed variables, so each one's
state sees a plain one-process run, waits for them, and stops the others as soon as one fails (as the
elastic agent does for a process group). ``--cpu_fallback`` forms one gloo group instead (torchrun mode).
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import Any

from accel_launch.process_guard import forward_signal, parent_death_hook

#: Variables through which torchrun tells a process it belongs to a group: a copy must not see them.
GROUP_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK")

#: Seconds the other copies get to finish after one failed, before they are killed.
STOP_GRACE_S = 30.0


def copy_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without the variables that would make a copy join a process group."""
    return {key: value for key, value in environ.items() if key not in GROUP_VARIABLES}


def _stop(processes: Sequence[subprocess.Popen], grace_s: float) -> None:
    for process in processes:
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + grace_s
    for process in processes:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _forward(processes: Sequence[subprocess.Popen]) -> dict[signal.Signals, Any]:
    """Pass SIGTERM (and SIGUSR1, as SIGTERM) on to every copy; the previous handlers."""
    return {
        signal.SIGTERM: forward_signal(signal.SIGTERM, processes),
        signal.SIGUSR1: forward_signal(signal.SIGUSR1, processes, as_signal=signal.SIGTERM),
    }


def run_copies(
    command: Sequence[str], environ: Mapping[str, str], count: int, grace_s: float = STOP_GRACE_S
) -> tuple[int, int | None]:
    """Run ``count`` copies of ``command`` with ``environ`` (less `GROUP_VARIABLES`) and wait for them.

    Args:
        command: the script's command line (``python script.py ...``).
        environ: the environment of the copies.
        count: how many copies (at least 1).
        grace_s: seconds the other copies get after one failed, before they are killed.

    Returns:
        ``(exit status, index of the copy that failed first or None)``: 0 when every copy succeeded,
        else the status of the first copy that failed (negative: killed by that signal).

    Raises:
        ValueError: ``count`` below 1.
        FileNotFoundError: the program of ``command`` does not exist.
    """
    if count < 1:
        raise ValueError(f"run_copies needs at least 1 copy, got count={count}")
    env = copy_environment(environ)
    processes: list[subprocess.Popen] = []
    previous: dict[signal.Signals, Any] = {}
    try:
        for _ in range(count):
            processes.append(subprocess.Popen(list(command), env=env, preexec_fn=parent_death_hook()))
        previous = _forward(processes)
        while True:
            codes = [process.poll() for process in processes]
            failed = [index for index, code in enumerate(codes) if code not in (None, 0)]
            if failed:
                first = failed[0]
                _stop(processes, grace_s)
                return int(codes[first]), first  # type: ignore[arg-type]
            if all(code == 0 for code in codes):
                return 0, None
            time.sleep(0.05)
    except KeyboardInterrupt:
        _stop(processes, grace_s)
        raise
    finally:
        if any(process.poll() is None for process in processes):  # an error while starting them
            _stop(processes, 0.0)
        for sig, handler in previous.items():
            if handler is not None:
                signal.signal(sig, handler)
