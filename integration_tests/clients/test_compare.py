"""The comparison of client figures with the reference (compare.py), on made-up figures: counts exactly,
losses relative to their size, digests over the whole model and per tensor, timings never."""

from __future__ import annotations

import compare

TOL = compare.Tolerance(scalar=1e-3, floor=0.1, model=1e-3, tensor=0.1)


def _digest(sums: dict[str, list[float]]) -> dict:
    return {"sha256": "recorded-elsewhere", "sums": sums}


REFERENCE = {
    "steps": 6,
    "checkpoints": ["checkpoint_4", "checkpoint_5"],
    "losses": [2.0, 1.5, 0.01],
    "eval_loss": None,
    "steps_per_second": 10.0,
    "params": _digest({"big": [5.0, 100.0], "bias": [0.1, 1.0], "key_bias": [1e-7, 1e-6]}),
}


def _ours(sums: dict | None = None, **changes) -> dict:
    return {**REFERENCE, **changes, "params": _digest({**REFERENCE["params"]["sums"], **(sums or {})})}


def test_equal_figures_and_another_machines_sha_and_timings_pass() -> None:
    ours = _ours(steps_per_second=3.0)
    ours["params"]["sha256"] = "this-machine"
    assert compare.differences(ours, REFERENCE, TOL) == []


def test_counts_and_names_are_exact() -> None:
    found = compare.differences(_ours(steps=7, checkpoints=["checkpoint_5"]), REFERENCE, TOL)
    assert len(found) == 2 and any(".steps: 7 vs 6" in line for line in found)
    assert compare.differences(_ours(eval_loss=1.0), REFERENCE, TOL)  # None stays None
    missing = {key: value for key, value in REFERENCE.items() if key != "losses"}
    assert any("figures missing ['losses']" in line for line in compare.differences(missing, REFERENCE, TOL))


def test_losses_relative_to_their_size_with_a_floor() -> None:
    assert not compare.differences(_ours(losses=[2.0015, 1.5, 0.01009]), REFERENCE, TOL)  # 7.5e-4, 9e-5/0.1
    found = compare.differences(_ours(losses=[2.0, 1.5, 0.0102]), REFERENCE, TOL)  # 2e-4 / 0.1 = 2e-3
    assert len(found) == 1 and ".losses[2]" in found[0] and "allowed 0.001" in found[0]
    assert compare.differences(_ours(losses=[2.0, 1.5]), REFERENCE, TOL)  # one loss fewer


def test_a_near_zero_tensor_may_move_alone_but_not_the_model() -> None:
    # the bias moves by 5% of itself: within the per-tensor tolerance, small over the whole model
    assert not compare.differences(_ours(sums={"bias": [0.105, 1.05]}), REFERENCE, TOL)
    # the bias doubles: that tensor is reported (and the model, which it moves by 1%), no other tensor
    found = compare.differences(_ours(sums={"bias": [0.1, 2.0]}), REFERENCE, TOL)
    assert [line.split(":")[0] for line in found] == [".params.bias", ".params"]
    # a tensor of rounding noise only (its gradient is zero) may change by many times itself
    assert not compare.differences(_ours(sums={"key_bias": [-5e-7, 3e-6]}), REFERENCE, TOL)
    # every tensor moves a little (0.2% of the model's magnitude): the model is reported, no tensor
    found = compare.differences(_ours(sums={"big": [5.2, 100.0]}), REFERENCE, TOL)
    assert len(found) == 1 and ".params: all tensors" in found[0]


def test_spread_reports_the_largest_deviation_of_each_kind() -> None:
    largest = compare.spread(_ours(losses=[2.0, 1.5, 0.0102], sums={"bias": [0.105, 1.05]}), REFERENCE, TOL)
    assert abs(largest["scalar"] - 2e-3) < 1e-9
    assert abs(largest["tensor"] - 0.05) < 1e-9
    assert abs(largest["model"] - 0.05 / 101.000001) < 1e-9
