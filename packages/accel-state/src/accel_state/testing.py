"""Run a function on several real CPU processes joined by gloo: the one helper every package's
multi-rank tests use.

``run_distributed(fn, world_size=2)`` starts fresh processes for one call. ``DistributedPool`` keeps
``world_size`` processes (and their process group) alive between calls, so a test suite pays for
process start-up once. In both, ``fn`` must be importable by name (defined at module level) and its
arguments and results picklable. An exception on any rank is re-raised here with every rank's
traceback; a rank that does not answer fails the call instead of hanging.

``timeout`` counts idle time: the seconds a call may go without an answer *while the ranks do no
work*. As long as the rank processes (or processes they started, such as a compiler building an
extension) keep using CPU, they are slow, not hung, and the wait goes on; on a loaded machine a
long call therefore does not fail for want of CPU. A hang (ranks blocked in a collective or a lock,
using no CPU) fails after ``timeout`` seconds as before. A rank that spins forever is left to the
test runner's own limit (pytest-timeout). Where ``/proc`` is missing, ``timeout`` is wall time. Once a
rank has raised, the others get 20 idle seconds, not ``timeout``: they are most likely blocked in a
collective the failed rank will never join.

Smaller helpers shared by the test suites: ``reset_shared_state``, ``free_port`` (from
``accel_state.ports``: a port kept free until the store binds it), and
``pickle_record_span`` for the damaged-checkpoint tests of accel-bigmodel and accel-train.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue as queue_module
import time
import traceback
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

from accel_state.ports import free_port

#: how often an unanswered call looks at the ranks' CPU time (seconds)
_POLL_SECONDS = 2.0
#: the share of one CPU the ranks must use over a poll for the wait to count as work, not idleness
_BUSY_SHARE = 0.02
#: once a rank has raised, how long the others may go without an answer while using no CPU (seconds)
_IDLE_AFTER_A_FAILURE = 20.0


def _tree_cpu_seconds(roots: list[int]) -> float | None:
    """CPU seconds used so far by the processes ``roots`` and every process below them.

    Read from ``/proc`` (user + system time, with that of reaped children), so a compiler started by a
    rank counts as the rank's work. ``None`` where ``/proc`` cannot be read.
    """
    try:
        entries = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return None
    parents: dict[int, int] = {}
    used: dict[int, float] = {}
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    for name in entries:
        try:
            with open(f"/proc/{name}/stat") as handle:
                stat = handle.read()
        except OSError:
            continue  # ended meanwhile
        fields = stat[stat.rindex(")") + 2 :].split()  # after the command name, from field 3 (state)
        parents[int(name)] = int(fields[1])
        used[int(name)] = sum(int(value) for value in fields[11:15]) / ticks  # utime stime cutime cstime
    wanted = set(roots)
    total = 0.0
    for pid in sorted(used):  # a parent's pid is not always lower: walk up instead
        node, seen = pid, set()
        while node in parents and node not in wanted and node not in seen and node > 1:
            seen.add(node)
            node = parents[node]
        if node in wanted:
            total += used[pid]
    return total


class DistributedTestFailure(AssertionError):
    """One or more ranks raised (or did not answer); the message holds each rank's traceback."""


def reset_shared_state() -> None:
    """Forget the shared states of this process (``AcceleratorState``, ``PartialState``, ``GradientState``)."""
    from accel_state.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def pickle_record_span(path: str | os.PathLike[str]) -> tuple[int, int]:
    """``(start, length)``: where the bytes of the ``data.pkl`` record lie in a ``torch.save`` zip file.

    Damaged-file tests garble bytes inside the pickle itself (not the zip's bookkeeping) to check that a
    reader calls it damage; ``torch.save`` stores the record uncompressed, so these are the pickle's bytes.

    Args:
        path: A file written by ``torch.save`` (its zip format, the default).

    Raises:
        ValueError: the file is not a zip holding a ``data.pkl`` record.
    """
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            info = next((i for i in archive.infolist() if i.filename.endswith("/data.pkl")), None)
    except zipfile.BadZipFile:
        info = None
    if info is None:
        raise ValueError(f"{os.fspath(path)!r} is not a torch.save zip with a data.pkl record")
    with open(path, "rb") as handle:
        handle.seek(info.header_offset + 26)  # the local header's name and extra-field lengths
        name_len, extra_len = int.from_bytes(handle.read(2), "little"), int.from_bytes(handle.read(2), "little")
    return info.header_offset + 30 + name_len + extra_len, info.compress_size


def _rank_env(rank: int, world_size: int, port: int, extra: Mapping[str, str] | None) -> dict[str, str]:
    env = {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "ACCELERATE_USE_CPU": "true",
        "OMP_NUM_THREADS": "1",
    }
    env.update(extra or {})
    return env


def _worker(rank: int, env: dict[str, str], tasks: Any, results: Any) -> None:
    os.environ.update(env)
    import torch

    torch.set_num_threads(1)
    while True:
        task = tasks.get()
        if task is None:
            break
        fn, args, kwargs = task
        try:
            results.put((rank, True, fn(*args, **kwargs)))
        except BaseException:
            results.put((rank, False, traceback.format_exc()))
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:
        pass


class DistributedPool:
    """``world_size`` CPU processes that run functions together; reuse it across tests."""

    def __init__(self, world_size: int = 2, timeout: float = 120.0, env: Mapping[str, str] | None = None) -> None:
        self.world_size = world_size
        self.timeout = timeout
        self._env = dict(env or {})
        self._procs: list[Any] = []
        self._tasks: list[Any] = []
        self._results: Any = None

    def start(self) -> DistributedPool:
        ctx = mp.get_context("spawn")
        port = free_port()
        self._results = ctx.Queue()
        self._tasks = [ctx.Queue() for _ in range(self.world_size)]
        self._procs = [
            ctx.Process(
                target=_worker,
                args=(rank, _rank_env(rank, self.world_size, port, self._env), self._tasks[rank], self._results),
                daemon=True,
            )
            for rank in range(self.world_size)
        ]
        for proc in self._procs:
            proc.start()
        return self

    def close(self) -> None:
        for tasks in self._tasks:
            try:
                tasks.put(None)
            except Exception:
                pass
        for proc in self._procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        self._procs = []

    def __enter__(self) -> DistributedPool:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float | None = None, **kwargs: Any) -> list[Any]:
        """Call ``fn(*args, **kwargs)`` on every rank; results in rank order."""
        if not self._procs:
            self.start()
        for tasks in self._tasks:
            tasks.put((fn, args, kwargs))
        answers: dict[int, tuple[bool, Any]] = {}
        limit = self.timeout if timeout is None else timeout
        try:
            while len(answers) < self.world_size:
                rank, ok, value = self._next_answer(limit)
                answers[rank] = (ok, value)
                if not ok:  # the other ranks most likely wait on the one that raised: do not wait long
                    limit = min(limit, _IDLE_AFTER_A_FAILURE)
        except queue_module.Empty:
            missing = [rank for rank in range(self.world_size) if rank not in answers]
            self._restart()
            errors = {rank: value for rank, (ok, value) in answers.items() if not ok}
            after = f" after rank(s) {sorted(errors)} raised" if errors else ""
            raise DistributedTestFailure(
                f"{getattr(fn, '__name__', fn)}: rank(s) {missing} did not answer within {limit} s{after} "
                "in which the ranks used no CPU (a hang)"
                + "".join(f"\n--- rank {rank} raised:\n{text}" for rank, text in errors.items())
            ) from None
        failures = {rank: value for rank, (ok, value) in answers.items() if not ok}
        if failures:
            self._restart()
            raise DistributedTestFailure(
                f"{getattr(fn, '__name__', fn)} failed on rank(s) {sorted(failures)}"
                + "".join(f"\n--- rank {rank}:\n{text}" for rank, text in sorted(failures.items()))
            )
        return [answers[rank][1] for rank in range(self.world_size)]

    def _next_answer(self, limit: float) -> tuple[int, bool, Any]:
        """The next rank's answer; ``queue.Empty`` after ``limit`` seconds in which the ranks did no work."""
        pids = [proc.pid for proc in self._procs if proc.pid is not None]
        now = time.monotonic()
        deadline, checked, cpu = now + limit, now, _tree_cpu_seconds(pids)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise queue_module.Empty
            try:
                return self._results.get(timeout=min(remaining, _POLL_SECONDS) if cpu is not None else remaining)
            except queue_module.Empty:
                if cpu is None:
                    raise
            now, used = time.monotonic(), _tree_cpu_seconds(pids)
            if used is None:
                continue
            if used - cpu >= _BUSY_SHARE * (now - checked):
                deadline = now + limit  # working (slowly, on a loaded machine): not a hang
            checked, cpu = now, used

    def _restart(self) -> None:
        for proc in self._procs:
            if proc.is_alive():
                proc.kill()
            proc.join(timeout=5)
        self._procs = []


def run_distributed(
    fn: Callable[..., Any],
    *args: Any,
    world_size: int = 2,
    timeout: float = 120.0,
    env: Mapping[str, str] | None = None,
    **kwargs: Any,
) -> list[Any]:
    """Call ``fn(*args, **kwargs)`` in ``world_size`` fresh processes; results in rank order."""
    with DistributedPool(world_size, timeout=timeout, env=env) as pool:
        return pool.run(fn, *args, **kwargs)
