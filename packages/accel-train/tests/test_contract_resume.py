"""A resumed run is the uninterrupted run, on every backend (the backend table in ``cpu_backends``).

For each backend, 2 real gloo processes train two steps, save, train two more (the uninterrupted run),
then load the checkpoint and train the same two steps again: the model, and the optimizer's next step,
must come out exactly equal. A backend whose optimizer state, parameter groups or random states do not
survive ``load_state`` fails here (a pipeline run once lost its optimizer's hyper-parameters this way).

Then the same checkpoint is resumed by one process (every process sees the same batches, so one process
trains the same global steps): the backend either resharding it gives the uninterrupted run within 1e-5,
or ``load_state`` refuses it by name, before changing anything. A backend that cannot run on one process
with its settings (tensor or pipeline parallelism over 2) is resumed by a plain one-process run.
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


def rank_resume_alone(backend: str, folder: str, base: str) -> dict:
    """One process loads the 2-process checkpoint ``folder`` and trains the two steps that followed it."""
    reset_shared_state()
    spec = BACKENDS_BY_NAME[backend]
    if backend in _NEEDS_TWO:
        spec = dataclasses.replace(BACKENDS_BY_NAME["ddp"], experts=spec.experts)
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


@pytest.mark.parametrize("backend", [b.name for b in CPU_BACKENDS if not b.pipeline])
def test_one_process_resumes_a_two_process_checkpoint_or_refuses_it_by_name(pools, tmp_path, backend: str) -> None:
    missing = BACKENDS_BY_NAME[backend].requires()
    if missing:
        pytest.skip(missing)
    if backend not in _SAVED:
        pytest.skip(f"the 2-process resume of {backend} did not run or failed in this session")
    folder, straight = _SAVED[backend]
    result = pools(1).run(rank_resume_alone, backend, folder, str(tmp_path), timeout=120)[0]
    if result["refused"] is not None:
        assert result["untouched"], f"{backend}: a refused load changed the model"
        assert folder in result["refused"] or "process" in result["refused"], result["refused"]
        return
    resumed = result["resumed"]
    assert sorted(resumed) == sorted(straight)
    worst = max((resumed[k] - straight[k]).abs().max().item() for k in straight)
    assert worst <= 1e-5, f"{backend}: resumed on 1 process, the model differs from the uninterrupted run by {worst}"
