"""Write failures during ``save_state`` on real gloo processes (issue 36, points 4 and 5), over every
backend that saves on CPU: a file-size limit on one rank at a time (what a full disk does to the writes of
that rank), the folder read-only, and a really full disk (a tmpfs, root only).

Whatever fails and wherever, every process of the save raises the same ``OSError`` naming the path and
the operating system's reason within seconds (none is left waiting in a collective), no partial folder
stays, and the previous checkpoint loads as it was. The one documented exception is DDP into an explicit
folder, where the main process saves alone (others may not call ``save_state`` at all): a failure of the
writer reaches the processes that called it too; a failure of another process's own files is its own.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import time

import pytest
import torch
from cpu_backends import BACKENDS_BY_NAME, CPU_BACKENDS

from accel_state.testing import reset_shared_state

pytestmark = pytest.mark.slow

#: A soft file-size limit smaller than any file of a checkpoint: every write of the rank under it fails.
FILE_SIZE_LIMIT = 512


@pytest.fixture
def pool(pools):
    """The session's pool of two processes (``pools(2)``, shared with the other multi-rank tests)."""
    return pools(2)


@contextlib.contextmanager
def _fault(kind: str, rank: int, failing: int | None, base: str):
    """Make the writes of ``failing`` (every rank: None) fail in the way ``kind`` says, for the block."""
    if kind == "file_size":
        if rank != failing:
            yield
            return
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG, no signal
        resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_LIMIT, hard))
        try:
            yield
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
            signal.signal(signal.SIGXFSZ, previous)
    elif kind == "read_only":  # the test mounted a tmpfs at ``base``
        _remount(base, "ro", rank)
        try:
            yield
        finally:
            _remount(base, "rw", rank)
    elif kind == "disk_full":
        filler = os.path.join(base, "filler")
        if rank == 0:
            _fill(filler)
        torch.distributed.barrier()
        try:
            yield
        finally:
            torch.distributed.barrier()
            if rank == 0:
                os.remove(filler)
    else:
        raise ValueError(kind)


def _fill(path: str) -> None:
    """Write ``path`` until the disk is full (the checkpoint is tiny: leave nothing free)."""
    with open(path, "wb", buffering=0) as handle:
        for size in (1 << 20, 1 << 16, 1 << 12, 1):
            try:
                while True:
                    handle.write(b"\0" * size)
            except OSError:
                continue


def _remount(base: str, mode: str, rank: int) -> None:
    if rank == 0:
        subprocess.run(["mount", "-o", f"remount,{mode}", base], check=True, capture_output=True)
    torch.distributed.barrier()


def rank_save_faults(backend: str, base: str, faults: list[tuple[str, int | None]]) -> list[dict]:
    """Save once; then, for each fault, train a step, try ``save_state`` under the fault, and load what is
    in the folder back. Returns, per fault, each rank's error, how long the failed save took, the partial
    folders left, and whether the folder still holds the first checkpoint."""
    reset_shared_state()
    spec = BACKENDS_BY_NAME[backend]
    accelerator = spec.accelerator(base)
    rank = accelerator.process_index
    model, optimizer = spec.prepare(accelerator)
    steps = iter(range(100))

    def step() -> None:  # a step changes the weights: a new save differs from the first one
        spec.step(accelerator, model, optimizer, next(steps))

    step()
    folder = accelerator.save_state(os.path.join(base, "ckpt"))
    saved = spec.state(accelerator, model)
    results = []
    for kind, failing in faults:
        step()
        error, errno = "", None
        started = time.monotonic()
        with _fault(kind, rank, failing, base):
            try:
                accelerator.save_state(os.path.join(base, "ckpt"))
            except OSError as raised:
                error, errno = f"{type(raised).__name__}: {raised}", raised.errno
        elapsed = time.monotonic() - started
        accelerator.wait_for_everyone()
        leftovers = sorted(e for e in os.listdir(os.path.dirname(folder)) if e.endswith((".partial", ".lock")))
        accelerator.load_state(folder)
        kept = all(torch.equal(value, saved[key]) for key, value in spec.state(accelerator, model).items())
        results.append({"error": error, "errno": errno, "elapsed": elapsed, "leftovers": leftovers, "kept": kept})
    reset_shared_state()
    return results


#: The faults of each test: per rank in turn, and of the whole folder (a tmpfs: root only).
FAULTS: dict[str, list[tuple[str, int | None]]] = {
    "per_rank": [("file_size", 0), ("file_size", 1)],
    "whole_folder": [("read_only", None), ("disk_full", None)],
}
REASONS = {"file_size": "File too large", "read_only": "Read-only file system", "disk_full": "No space left"}


@pytest.mark.parametrize("group", sorted(FAULTS))
@pytest.mark.parametrize("backend", [backend.name for backend in CPU_BACKENDS])
def test_a_failed_write_raises_the_same_named_error_on_every_process(pool, tmp_path, backend: str, group: str) -> None:
    missing = BACKENDS_BY_NAME[backend].requires()
    if missing:
        pytest.skip(missing)
    base = str(tmp_path / "disk")
    faults = FAULTS[group]
    mounted = group == "whole_folder" and _mount(base)
    if group == "whole_folder" and not mounted:
        pytest.skip("a read-only or full folder is made with a tmpfs mount, which needs root here")
    os.makedirs(base, exist_ok=True)
    try:
        on_rank = pool.run(rank_save_faults, backend, base, faults, timeout=120)
    finally:
        if mounted:
            subprocess.run(["umount", "-l", base], capture_output=True)
    for index, (kind, failing) in enumerate(faults):
        first, second = on_rank[0][index], on_rank[1][index]
        case = f"{backend}, {kind} on rank {failing}"
        for result in (first, second):
            assert result["leftovers"] == [], f"{case}: left {result['leftovers']}"
        if backend == "ddp" and failing == 1:  # the main process saved alone and succeeded
            assert first["error"] == "", case
            assert REASONS[kind] in second["error"] and "random_states_1" in second["error"], (case, second)
            continue
        for result in (first, second):
            assert result["kept"], f"{case}: the previous checkpoint changed"
        for result in (first, second):
            assert result["error"].startswith("OSError: [Errno"), (case, result)
            assert REASONS[kind] in result["error"] and base in result["error"], (case, result)
            assert result["elapsed"] < 60, (case, result["elapsed"])
        assert first["error"] == second["error"] and first["errno"] == second["errno"], (case, first, second)


def _mount(path: str) -> bool:
    os.makedirs(path, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", path], capture_output=True)
    return done.returncode == 0
