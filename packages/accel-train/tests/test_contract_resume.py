"""A resumed run is the uninterrupted run, on every backend (the backend table in ``cpu_backends``).

For each backend, 2 real gloo processes train two steps, save, train two more (the uninterrupted run),
then load the checkpoint and train the same two steps again: the model, and the optimizer's next step,
must come out exactly equal. A backend whose optimizer state, parameter groups or random states do not
survive ``load_state`` fails here (a pipeline run once lost its optimizer's hyper-parameters this way).

Then the checkpoint changes hands (every process sees the same batches, so any number of processes
trains the same global steps): 2 -> 1 (the same checkpoint, resumed by one process), 2 -> 4 (by four,
where the parallel sizes take the extra factor as sharded data) and 1 -> 2 (a one-process run's
checkpoint resumed by two). The backend either reshards it and gives the uninterrupted run within 1e-5,
or ``load_state`` refuses it by name, before changing anything. A backend that cannot run on one process
with its settings (tensor, expert or pipeline parallelism over 2) is stood in for there by a plain
one-process run of the same model.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
from cpu_backends import BACKENDS_BY_NAME, CPU_BACKENDS

from accel_state.testing import reset_shared_state

pytestmark = pytest.mark.slow

#: backend -> (checkpoint folder, the uninterrupted run's state after the two steps that follow the save),
#: filled by the 2-process test and read by the 1-process one (the same file, so the same test worker).
_SAVED: dict[str, tuple[str, dict[str, torch.Tensor]]] = {}

#: Backends whose settings need 2 processes: resumed on one process by a plain run (of the same model).
_NEEDS_TWO = {"tp", "pipeline", "ep"}


@pytest.fixture
def pool(pools):
    """The session's pool of two processes (``pools(2)``, shared with the other multi-rank tests)."""
    return pools(2)


def rank_resume(backend: str, base: str) -> dict:
    reset_shared_state()
    spec = BACKENDS_BY_NAME[backend]
    accelerator = spec.accelerator(base)
    model, optimizer = spec.prepare(accelerator)
    for index in (0, 1):
        spec.step(accelerator, model, optimizer, index)
    folder = accelerator.save_state(os.path.join(base, "ckpt"))
    at_save = spec.state(accelerator, model)
    for index in (2, 3):
        spec.step(accelerator, model, optimizer, index)
    straight = spec.state(accelerator, model)
    accelerator.load_state(folder)
    loaded = spec.state(accelerator, model)
    for index in (2, 3):
        spec.step(accelerator, model, optimizer, index)
    resumed = spec.state(accelerator, model)
    ran = accelerator._strategy.name
    reset_shared_state()
    return {
        "strategy": ran,
        "folder": folder,
        "straight": straight,
        "loaded": sorted(k for k in at_save if not torch.equal(at_save[k], loaded[k])),
        "differ": sorted(k for k in straight if not torch.equal(straight[k], resumed[k])),
        "moved": any(not torch.equal(straight[k], at_save[k]) for k in straight),
    }


@pytest.mark.parametrize("backend", [backend.name for backend in CPU_BACKENDS])
def test_a_resumed_run_equals_the_uninterrupted_one(pool, tmp_path, backend: str) -> None:
    missing = BACKENDS_BY_NAME[backend].requires()
    if missing:
        pytest.skip(missing)
    results = pool.run(rank_resume, backend, str(tmp_path), timeout=120)
    for rank, result in enumerate(results):
        assert result["strategy"] == BACKENDS_BY_NAME[backend].strategy, f"{backend} ran {result['strategy']}"
        assert result["moved"], f"{backend}: the two steps after the save changed nothing (rank {rank})"
        assert result["loaded"] == [], f"{backend}: load_state did not bring back {result['loaded']} (rank {rank})"
        assert result["differ"] == [], f"{backend}: the resumed run differs in {result['differ']} (rank {rank})"
    if not BACKENDS_BY_NAME[backend].pipeline:  # a pipeline's state is per stage: no whole model to compare
        _SAVED[backend] = (results[0]["folder"], results[0]["straight"])


def _spec_here(backend: str):
    """The backend's entry, or on one process a plain run of its model when it needs two."""
    spec = BACKENDS_BY_NAME[backend]
    alone = int(os.environ.get("WORLD_SIZE", "1")) == 1  # the pool's size (its group starts with the Accelerator)
    if alone and backend in _NEEDS_TWO:
        spec = dataclasses.replace(BACKENDS_BY_NAME["ddp"], experts=spec.experts)
    return spec


def rank_resume_alone(backend: str, folder: str, base: str) -> dict:
    """This pool's processes load the checkpoint ``folder`` and train the two steps that followed it."""
    reset_shared_state()
    spec = _spec_here(backend)
    accelerator = spec.accelerator(base)
    model, optimizer = spec.prepare(accelerator)
    before = spec.state(accelerator, model)
    try:
        accelerator.load_state(folder)
    except Exception as error:
        untouched = all(torch.equal(before[k], v) for k, v in spec.state(accelerator, model).items())
        reset_shared_state()
        return {"refused": f"{type(error).__name__}: {error}", "untouched": untouched}
    for index in (2, 3):
        spec.step(accelerator, model, optimizer, index)
    resumed = spec.state(accelerator, model)
    reset_shared_state()
    return {"refused": None, "resumed": resumed}


def _assert_resumed_or_refused(backend: str, result: dict, folder: str, straight: dict) -> None:
    if result["refused"] is not None:
        assert result["untouched"], f"{backend}: a refused load changed the model"
        assert folder in result["refused"] or "process" in result["refused"], result["refused"]
        return
    resumed = result["resumed"]
    assert sorted(resumed) == sorted(straight)
    worst = max((resumed[k] - straight[k]).abs().max().item() for k in straight)
    assert worst <= 1e-5, f"{backend}: resumed, the model differs from the uninterrupted run by {worst}"


_RESHARDED = [b.name for b in CPU_BACKENDS if not b.pipeline]  # a pipeline's stages are per process count

#: CI runs 2 -> 4 and 1 -> 2 for the backends whose state is sharded differently per process count; the
#: others (their state whole on every process, or the same sharding code as a CI case) run before a release
#: (``nox -s slow`` sets ACCEL_RELEASE_TESTS=1). 2 -> 1 runs for every backend in CI.
_CI_CASES = {"four": {"fsdp2", "zero3", "tp", "ep"}, "two": {"fsdp1", "zero2", "ep"}}


def _release_only(case: str, backend: str) -> None:
    if backend not in _CI_CASES[case] and os.environ.get("ACCEL_RELEASE_TESTS") != "1":
        covered = ", ".join(sorted(_CI_CASES[case]))
        pytest.skip(f"release-only (nox -s slow): CI covers this resharding with {covered}")


def _saved_by_two(backend: str) -> tuple[str, dict]:
    missing = BACKENDS_BY_NAME[backend].requires()
    if missing:
        pytest.skip(missing)
    if backend not in _SAVED:
        pytest.skip(f"the 2-process resume of {backend} did not run or failed in this session")
    return _SAVED[backend]


@pytest.mark.parametrize("backend", _RESHARDED)
def test_one_process_resumes_a_two_process_checkpoint_or_refuses_it_by_name(pools, tmp_path, backend: str) -> None:
    folder, straight = _saved_by_two(backend)
    result = pools(1).run(rank_resume_alone, backend, folder, str(tmp_path), timeout=120)[0]
    _assert_resumed_or_refused(backend, result, folder, straight)


@pytest.mark.parametrize("backend", _RESHARDED)
def test_four_processes_resume_a_two_process_checkpoint_or_refuse_it_by_name(pools, tmp_path, backend: str) -> None:
    _release_only("four", backend)
    folder, straight = _saved_by_two(backend)
    for rank, result in enumerate(pools(4).run(rank_resume_alone, backend, folder, str(tmp_path), timeout=180)):
        _assert_resumed_or_refused(f"{backend} (rank {rank} of 4)", result, folder, straight)


def rank_save_alone(backend: str, base: str) -> dict:
    """One process trains two steps, saves, and trains the two that follow (the uninterrupted run)."""
    reset_shared_state()
    spec = _spec_here(backend)
    accelerator = spec.accelerator(base)
    model, optimizer = spec.prepare(accelerator)
    for index in (0, 1):
        spec.step(accelerator, model, optimizer, index)
    folder = accelerator.save_state(os.path.join(base, "ckpt"))
    for index in (2, 3):
        spec.step(accelerator, model, optimizer, index)
    straight = spec.state(accelerator, model)
    reset_shared_state()
    return {"folder": folder, "straight": straight}


@pytest.mark.parametrize("backend", _RESHARDED)
def test_two_processes_resume_a_one_process_checkpoint_or_refuse_it_by_name(pools, tmp_path, backend: str) -> None:
    _release_only("two", backend)
    missing = BACKENDS_BY_NAME[backend].requires()
    if missing:
        pytest.skip(missing)
    saved = pools(1).run(rank_save_alone, backend, str(tmp_path / "one"), timeout=120)[0]
    results = pools(2).run(rank_resume_alone, backend, saved["folder"], str(tmp_path / "two"), timeout=120)
    for rank, result in enumerate(results):
        _assert_resumed_or_refused(f"{backend} (rank {rank} of 2)", result, saved["folder"], saved["straight"])
