"""Test support for crash-safety tests: run an action in a fresh process that SIGKILLs itself at its
k-th file-system step, for many k, and say which runs were killed.

Why not ``os.fork`` from the test: a process that has run torch has threads, and a forked child gets a
copy of every lock those threads held at that instant, locked for good. Such a child can wait on a
futex forever with no CPU used. The children here come from a zygote: a fresh interpreter that
imports torch (and whatever else is named) but runs nothing, checks that it still has one thread, and
forks a child per run. Each child costs a fork, not an interpreter start and torch import.

The protocol between a driver and its child script:

* the child calls `die_with_parent()` first, so that a driver killed by a test runner's timeout
  takes its children with it;
* the child builds a `StepCounter` from its arguments, wraps the calls that count as steps
  with `StepCounter.wrap()` (or calls `StepCounter.tick()` itself), runs the action and
  exits 0; the counter SIGKILLs it at step ``kill_at``;
* run with ``kill_at == 0`` (a counting run) the child writes the label of every step, one a line,
  to the log file it is given, so the driver knows how many steps there are and what each one is.

Which steps a driver kills at comes from `choose_kill_points()`: every step where a save
commits (a rename, a swap, a removal) and the steps next to it, the first step, and an even spread of
the rest up to a budget. ``ACCEL_KILL_POINTS=all`` (the ``slow`` nox session) takes every step.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any

#: The environment variable that asks for every kill point instead of the chosen ones.
ALL_POINTS_VARIABLE = "ACCEL_KILL_POINTS"


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent ends (no-op elsewhere).

    A child started by a driver that a test runner then kills would otherwise live on as an orphan.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return
    parent = os.getppid()
    libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died during the call
        os._exit(1)


class StepCounter:
    """Counts the file-system steps of one action and SIGKILLs this process at step ``kill_at``.

    Args:
        kill_at: The step (1-based) to die at; 0 counts every step and never kills.
        log: Where a counting run (``kill_at == 0``) writes each step's label, one a line.
    """

    def __init__(self, kill_at: int, log: str | None = None) -> None:
        self.kill_at = kill_at
        self.count = 0
        self._log = open(log, "w", encoding="utf-8") if (log and kill_at == 0) else None  # noqa: SIM115

    def tick(self, label: str) -> None:
        """One step, named ``label``: logged in a counting run, the process dies at step ``kill_at``.

        Args:
            label: What the step is (``"os.replace:before"``, ``"write:half"`` ...).
        """
        self.count += 1
        if self._log is not None:
            self._log.write(label + "\n")
            self._log.flush()
        if self.count == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    def wrap(self, owner: Any, name: str, label: str | None = None) -> None:
        """Replace ``owner.name`` with a function that ticks before and after calling it.

        Args:
            owner: The module or class holding the function.
            name: The attribute to wrap.
            label: The step's label; ``owner.name`` by default.
        """
        original = getattr(owner, name)
        base = label or f"{getattr(owner, '__name__', type(owner).__name__)}.{name}"

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            self.tick(base + ":before")
            result = original(*args, **kwargs)
            self.tick(base + ":after")
            return result

        setattr(owner, name, wrapped)


#: Label fragments of the steps where a save commits: the interesting places to die at.
COMMIT_STEPS = ("rename", "replace", "rmtree", "remove", "unlink", "link", "exchange", "swap")


def choose_kill_points(labels: Sequence[str], budget: int = 24, every: bool | None = None) -> list[int]:
    """The steps (1-based) a driver kills at, in order.

    Every step whose label names a commit (`COMMIT_STEPS`), with the step before and after it,
    and the first step; then an even spread of the other steps until ``budget`` points are chosen.
    Commit points are kept even past the budget: they are where a mix of two saves would show.

    Args:
        labels: The label of each step, from a counting run.
        budget: How many points to choose at most, besides the commit points.
        every: Take every step; by default, when ``ACCEL_KILL_POINTS=all`` is set.

    Returns:
        The chosen steps, ascending.
    """
    total = len(labels)
    if every is None:
        every = os.environ.get(ALL_POINTS_VARIABLE, "").lower() == "all"
    if every or total <= budget:
        return list(range(1, total + 1))
    chosen = {1}
    for index, label in enumerate(labels, start=1):
        if any(fragment in label.lower() for fragment in COMMIT_STEPS):
            chosen.update(k for k in (index - 1, index, index + 1) if 1 <= k <= total)
    rest = [k for k in range(1, total + 1) if k not in chosen]
    room = max(budget - len(chosen), 0)
    if room and rest:
        stride = len(rest) / room
        chosen.update(rest[int(i * stride)] for i in range(min(room, len(rest))))
    return sorted(chosen)


def run_kill_points(
    command: Callable[[int], list[str]],
    points: Sequence[int],
    jobs: int = 2,
    timeout: float = 300,
    preload: Sequence[str] = ("torch",),
) -> dict[int, bool]:
    """Run the child ``command(k)`` for every k in ``points``, ``jobs`` at a time; say which were killed.

    The children are forked from a zygote: a fresh interpreter that imports ``preload`` once, with
    OpenBLAS kept to one thread, and forks each child (which runs the script of its command line as
    ``__main__``) only while it has a single thread, so no lock can be copied held. Where that cannot be
    checked (no ``/proc``) or does not hold, each child is a fresh interpreter instead (slower: it imports
    torch itself). A zygote killed by a timeout takes its children with it.

    Args:
        command: The child's command line for kill point ``k``: ``[python, script, args...]``; it must
            work in its own folder. It is called here, in this thread, for every point in order before
            any child starts, so it may prepare the point's folder with torch.
        points: The kill points.
        jobs: How many children run at once.
        timeout: Seconds one child may take.
        preload: Modules the zygote imports before forking (what every child would import anyway); the
            folders of the children's scripts are on its path.

    Returns:
        ``{k: killed}``: True where the child died of SIGKILL, False where it finished (exit 0).

    Raises:
        RuntimeError: A child exited non-zero or by another signal (its output is in the message).
    """
    import json
    import math
    import tempfile

    with tempfile.TemporaryDirectory(prefix="accel-kill-points-") as scratch:
        runs: list[tuple[int, list[str], str]] = [
            (point, command(point), os.path.join(scratch, f"{point}.out")) for point in points
        ]
        zygote = subprocess.run(
            [sys.executable, "-c", "from accel_state.kill_points import _zygote; _zygote()"],
            input=json.dumps({"preload": list(preload), "jobs": max(jobs, 1), "runs": runs}),
            capture_output=True,
            text=True,
            timeout=timeout * math.ceil(max(len(points), 1) / max(jobs, 1)) + 60,
            env={**os.environ, "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS", "1")},
            check=False,
        )
        if zygote.returncode != 0:
            raise RuntimeError(f"the kill-point zygote exited with {zygote.returncode}:\n{zygote.stderr[-4000:]}")
        codes = {int(point): code for point, code in json.loads(zygote.stdout.splitlines()[-1]).items()}
        killed: dict[int, bool] = {}
        for point, _, output in runs:
            if codes[point] == -signal.SIGKILL:
                killed[point] = True
            elif codes[point] == 0:
                killed[point] = False
            else:
                with open(output, encoding="utf-8", errors="replace") as handle:
                    text = handle.read()[-4000:]
                raise RuntimeError(f"the child for kill point {point} exited with {codes[point]}:\n{text}")
        return killed


def _single_threaded() -> bool:
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return False


def _start_child(argv: list[str], output: str) -> int:
    """Fork a child that runs ``argv``'s script as ``__main__`` (or start ``argv`` afresh); its pid."""
    if not (hasattr(os, "fork") and _single_threaded()):
        with open(output, "wb") as sink:
            return subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT).pid
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:  # the child
        import runpy
        import traceback

        sink_fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(sink_fd, 1)
        os.dup2(sink_fd, 2)
        sys.argv = list(argv[1:])
        try:
            runpy.run_path(argv[1], run_name="__main__")
            code = 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        except BaseException:
            traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _zygote() -> None:
    """The zygote's main: read the runs (JSON on stdin), import the preloads, run the children, ``jobs``
    at a time; print ``{point: returncode}`` (a negative code: killed by that signal) as one JSON line."""
    import importlib
    import json

    die_with_parent()
    request = json.load(sys.stdin)
    for folder in {os.path.dirname(os.path.abspath(argv[1])) for _, argv, _ in request["runs"]}:
        sys.path.insert(0, folder)  # the scripts' own folders, as a child started afresh would have
    for name in request["preload"]:
        importlib.import_module(name)
    pending = list(request["runs"])
    running: dict[int, int] = {}
    codes: dict[int, int] = {}
    while pending or running:
        while pending and len(running) < request["jobs"]:
            point, argv, output = pending.pop(0)
            running[_start_child(argv, output)] = point
        pid, status = os.wait()
        if pid in running:
            codes[running.pop(pid)] = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    print(json.dumps(codes))
