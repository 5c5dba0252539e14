"""prepare_pippy on torch.distributed.pipelining with two real gloo CPU processes."""

from __future__ import annotations

import pytest
import torch

from accel_state.testing import DistributedPool


def _pipeline_matches(split: str) -> dict[str, object]:
    from bigmodel_models import Mlp

    from accel_bigmodel.inference import prepare_pippy
    from accel_state.state import PartialState

    state = PartialState()
    torch.manual_seed(0)
    model = Mlp(depth=4, width=8).eval()
    inputs = torch.randn(4, 8)
    with torch.no_grad():
        expected = model(inputs)
    split_points = "auto" if split == "auto" else [split]
    model = prepare_pippy(model, split_points=split_points, example_args=(inputs,), gather_output=True)
    with torch.no_grad():
        output = model(inputs)
    return {
        "rank": state.process_index,
        "close": bool(torch.allclose(output, expected, atol=1e-6)),
        "split_points": model.hf_split_points,
    }


def _bad_split_points() -> str:
    from bigmodel_models import Mlp

    from accel_bigmodel.inference import prepare_pippy

    try:
        prepare_pippy(Mlp(), split_points=["layers.nope"], example_args=(torch.randn(2, 8),))
    except ValueError as err:
        return str(err)
    return "no error"


@pytest.mark.timeout(240)
def test_prepare_pippy_two_stages(dist_pool: DistributedPool) -> None:
    for split in ("auto", "layers.2"):
        results = dist_pool.run(_pipeline_matches, split)
        assert [r["close"] for r in results] == [True, True], results
        assert results[0]["split_points"] == results[1]["split_points"]
        if split != "auto":
            assert results[0]["split_points"] == ["layers.2"]
    errors = dist_pool.run(_bad_split_points)
    assert all("layers.nope" in e for e in errors), errors


def test_prepare_pippy_needs_example_inputs() -> None:
    from bigmodel_models import Mlp

    from accel_bigmodel.inference import prepare_pippy

    with pytest.raises(ValueError, match="example_args"):
        prepare_pippy(Mlp())


def test_first_neighbour_exchange_sends_what_is_received() -> None:
    """torch 2.9 sends an int64 stage index into a float32 buffer before the first step (gloo aborts on
    the size mismatch); the wrapper sends float32, and leaves float32 tensors (later torch) as they are."""
    from types import SimpleNamespace

    from accel_bigmodel.inference import match_init_p2p_dtypes

    kept = torch.zeros(1)
    ops = [SimpleNamespace(tensor=torch.tensor(3)), SimpleNamespace(tensor=kept)]
    stage = SimpleNamespace(_get_init_p2p_neighbors_ops=lambda: ops)
    sent = match_init_p2p_dtypes(stage)._get_init_p2p_neighbors_ops()
    assert [op.tensor.dtype for op in sent] == [torch.float32, torch.float32]
    assert sent[0].tensor.item() == 3.0 and sent[1].tensor is kept
    bare = SimpleNamespace()
    assert match_init_p2p_dtypes(bare) is bare and not vars(bare)
