"""Each backend trains with every mixed precision its strategy declares, and refuses the others by name
(the backend table in ``cpu_backends``; the declared set is the strategy's ``precisions``, the one
compatibility table the connector checks).

For each backend, 2 real gloo processes build an Accelerator with ``mixed_precision`` ``bf16`` and then
``fp16`` (``no`` is what every other contract case runs): a declared mode prepares, takes two optimizer
steps with a finite loss and moves the weights; a mode the strategy does not declare (or that the CPU
cannot run, `REFUSED_ON_CPU`) raises a ``ValueError`` naming the mode and the strategy before anything is
prepared. ``fp8`` needs
TransformerEngine, torchao or MS-AMP kernels and has cases of its own (``test_train_fp8.py``,
``test_train_deepspeed_fp8.py``). A backend added to the table gets this test with nothing to write.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from cpu_backends import BACKENDS_BY_NAME, CPU_BACKENDS

from accel_state.enums import PrecisionType
from accel_state.testing import reset_shared_state

pytestmark = pytest.mark.slow

MODES = ("bf16", "fp16")

#: Declared modes the device here cannot run: refused by name when the Accelerator is built (on CPU).
REFUSED_ON_CPU = {("deepspeed", "fp16"): "DeepSpeed's CPU accelerator has no fp16"}


@pytest.fixture
def pool(pools):
    """The session's pool of two processes (``pools(2)``, shared with the other multi-rank tests)."""
    return pools(2)


def _declared(strategy: str) -> set[str]:
    from accel_train.strategies import strategy_class

    return {mode.value for mode in strategy_class(strategy).precisions}


def rank_each_precision(backend: str, base: str) -> dict[str, dict]:
    """Per mode: what the strategy ran, or the error that refused it."""
    spec = BACKENDS_BY_NAME[backend]
    outcomes: dict[str, dict] = {}
    for mode in MODES:
        reset_shared_state()
        given = spec.kwargs

        def with_mode(folder: str, given=given, mode=mode) -> dict:
            return {**given(folder), "mixed_precision": mode}

        moded = dataclasses.replace(spec, kwargs=with_mode)
        try:
            accelerator = moded.accelerator(base)
        except ValueError as error:
            outcomes[mode] = {"refused": str(error)}
            continue
        model, optimizer = moded.prepare(accelerator)
        before = moded.state(accelerator, model)
        losses = []
        # DeepSpeed converts the model to the mode's dtype and does not cast inputs (as documented): a
        # script feeds that dtype; the other backends autocast float32 inputs
        dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())
        for index in (0, 1):
            generator = torch.Generator().manual_seed(100 + index)
            x = torch.randn(4, 4, generator=generator)
            target = x.sum(dim=1, keepdim=True).sin()
            loss = moded.loss(model, x.to(dtype), target.to(dtype))
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(float(loss.detach().float()))
        after = moded.state(accelerator, model)
        moved = any(not torch.equal(before[k], after[k]) for k in before)
        outcomes[mode] = {"refused": None, "strategy": accelerator._strategy.name, "losses": losses, "moved": moved}
    reset_shared_state()
    return outcomes


@pytest.mark.parametrize("backend", [backend.name for backend in CPU_BACKENDS])
def test_declared_precisions_train_and_the_others_are_refused_by_name(pool, tmp_path, backend: str) -> None:
    spec = BACKENDS_BY_NAME[backend]
    missing = spec.requires()
    if missing:
        pytest.skip(missing)
    declared = _declared(spec.strategy)
    assert PrecisionType.NO.value in declared, f"{spec.strategy} does not declare full precision"
    for rank, outcomes in enumerate(pool.run(rank_each_precision, backend, str(tmp_path), timeout=180)):
        for mode, outcome in outcomes.items():
            where = f"{backend}, mixed_precision={mode}, rank {rank}"
            if mode in declared and (spec.strategy, mode) not in REFUSED_ON_CPU:
                assert outcome["refused"] is None, f"{where}: declared but refused: {outcome['refused']}"
                assert outcome["strategy"] == spec.strategy, where
                assert all(math.isfinite(loss) for loss in outcome["losses"]), f"{where}: {outcome['losses']}"
                assert outcome["moved"], f"{where}: two steps changed no weight"
            else:
                assert outcome["refused"] is not None, f"{where}: not declared by {spec.strategy}, yet it ran"
                assert repr(mode) in outcome["refused"] and spec.strategy in outcome["refused"], outcome["refused"]
