"""A resumed run is the uninterrupted run, on every backend (the backend table in ``cpu_backends``).

For each backend, 2 real gloo processes train two steps, save, train two more (the uninterrupted run),
then load the checkpoint and train the same two steps again: the model, and the optimizer's next step,
must come out exactly equal. A backend whose optimizer state, parameter groups or random states do not
survive ``load_state`` fails here (a pipeline run once lost its optimizer's hyper-parameters this way).
"""

from __future__ import annotations

import os

import pytest
import torch
from cpu_backends import BACKENDS_BY_NAME, CPU_BACKENDS

from accel_state.testing import reset_shared_state

pytestmark = pytest.mark.slow


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
        "loaded": sorted(k for k in at_save if not torch.equal(at_save[k], loaded[k])),
        "differ": sorted(k for k in straight if not torch.equal(straight[k], resumed[k])),
        "moved": any(not torch.equal(straight[k], at_save[k]) for k in straight),
    }


@pytest.mark.parametrize("backend", [backend.name for backend in CPU_BACKENDS])
def test_a_resumed_run_equals_the_uninterrupted_one(pool, tmp_path, backend: str) -> None:
    missing = BACKENDS_BY_NAME[backend].requires()
    if missing:
        pytest.skip(missing)
    for rank, result in enumerate(pool.run(rank_resume, backend, str(tmp_path), timeout=120)):
        assert result["strategy"] == BACKENDS_BY_NAME[backend].strategy, f"{backend} ran {result['strategy']}"
        assert result["moved"], f"{backend}: the two steps after the save changed nothing (rank {rank})"
        assert result["loaded"] == [], f"{backend}: load_state did not bring back {result['loaded']} (rank {rank})"
        assert result["differ"] == [], f"{backend}: the resumed run differs in {result['differ']} (rank {rank})"
