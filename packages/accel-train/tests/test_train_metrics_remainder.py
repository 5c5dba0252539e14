"""gather_for_metrics keeps the real samples of the last global batch, also when the caller expanded
each batch to a fixed number of entries (an evaluation loop that repeats a batch's mean loss
``batch_size`` times, as transformers' Trainer does), on one process and on two."""

from __future__ import annotations

import pytest
import torch

from accel_state.testing import DistributedPool, reset_shared_state


def _loss_per_sample(values: torch.Tensor) -> torch.Tensor:
    return (values.float() * 0.37 + 1.0) ** 2  # any per-sample function of the data


def rank_expanded_eval(length: int, batch: int) -> dict:
    reset_shared_state()
    from accel_train import Accelerator

    accelerator = Accelerator(cpu=True)
    loader = accelerator.prepare(torch.utils.data.DataLoader(torch.arange(length), batch_size=batch))
    fixed = None
    expanded, remainders = [], []
    for values in loader:
        fixed = fixed or len(values)  # the first batch's size, as the Trainer keeps it
        mean_loss = _loss_per_sample(values).mean()
        expanded.append(accelerator.gather_for_metrics(mean_loss.repeat(fixed)))
        remainders.append(accelerator.gradient_state.remainder)
    return {"expanded": torch.cat(expanded).tolist(), "remainders": remainders}


@pytest.mark.parametrize(("length", "batch"), [(10, 4), (12, 4), (7, 3)])
def test_one_process_expanded_last_batch_is_cut_to_its_real_samples(length: int, batch: int) -> None:
    out = rank_expanded_eval(length, batch)
    assert len(out["expanded"]) == length
    assert set(out["remainders"]) == {length % batch}
    # the weighted mean equals the hand computation: each batch's mean weighted by its real samples
    expected = sum(
        _loss_per_sample(torch.arange(start, min(start + batch, length))).mean().item()
        * (min(start + batch, length) - start)
        for start in range(0, length, batch)
    )
    assert sum(out["expanded"]) / len(out["expanded"]) == pytest.approx(expected / length, rel=1e-6)


def test_gradient_state_remainder_is_real_samples_in_last_global_batch(dist_pool: DistributedPool) -> None:
    results = dist_pool.run(rank_expanded_eval, 10, 4)
    for out in results:
        # 10 samples, global batch 8: the last global batch holds 2 real samples (and 6 duplicates)
        assert out["remainders"] == [2, 2]
        assert len(out["expanded"]) == 8 + 2
    assert results[0]["expanded"] == results[1]["expanded"]
