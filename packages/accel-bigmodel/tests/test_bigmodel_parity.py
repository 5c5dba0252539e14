"""Device-map planning as release 1.15 of the documented system does it (issue 17, item 11)."""

from __future__ import annotations

import logging
import warnings
from collections import OrderedDict

import pytest
from torch import nn

from accel_bigmodel.planning import infer_auto_device_map
from accel_bigmodel.sizes import compute_module_sizes


class ThreeLayers(nn.Module):
    """Sizes in float32: first 64 bytes, norm 72 (40 of them buffers), last 100."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(3, 4)
        self.norm = nn.BatchNorm1d(4)
        self.last = nn.Linear(4, 5)


def test_a_tied_model_that_fits_is_not_split() -> None:
    model = ThreeLayers()
    model.first.weight = model.last.weight  # the first layer now shares the last one's 80-byte weight
    assert compute_module_sizes(model)[""] == 188
    # Placed with `last`, `first` leaves only `norm` to place; `last` no longer counts toward the reserve.
    assert infer_auto_device_map(model, max_memory={0: 200, 1: 200}) == {"": 0}


def test_tied_layers_placed_early_stop_counting_toward_the_reserve() -> None:
    model = nn.Sequential(
        OrderedDict(
            [
                ("embed", nn.Sequential(nn.Linear(3, 2, bias=True))),  # 32 bytes
                ("small", nn.Linear(3, 2, bias=False)),  # 24 bytes
                ("head", nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 2))),  # 48 + 32 bytes
            ]
        )
    )
    model.head[1].weight = model.embed[0].weight
    sizes = compute_module_sizes(model)
    assert sizes[""] == 32 + 24 + 48 + 8
    # embed goes with head (32 + 56 = 88, reserve 48 for head.0 while head waits): 88 <= 140 - 48.
    # Then only `small` is left: nothing else to reserve room for, so it fits too.
    assert infer_auto_device_map(model, max_memory={0: 140, "cpu": 1000}) == {"": 0}


def test_a_module_too_big_alone_is_split_even_when_it_has_ties() -> None:
    model = nn.Module()
    model.block = nn.Sequential(nn.Linear(3, 4, bias=False), nn.Linear(4, 4, bias=False))  # 48 + 64
    model.other = nn.Linear(4, 4)  # 80, the largest layer
    model.head = nn.Linear(3, 4, bias=False)
    model.head.weight = model.block[0].weight
    # block (112) does not fit in 150 - 80; it is split and block.0 goes with head.
    device_map = infer_auto_device_map(model, max_memory={0: 150, "cpu": 1000})
    assert device_map == {"block.0": 0, "head": 0, "block.1": "cpu", "other": "cpu"}


def test_buffer_check_counts_the_reserve_as_used_and_logs(caplog: pytest.LogCaptureFixture) -> None:
    model = ThreeLayers()
    # first (64) on 0, with 100 kept for `last`; norm's 40 bytes of buffers cannot join: 64 + 100 + 40 > 200.
    with caplog.at_level(logging.INFO, logger="accel_bigmodel.planning"):
        with pytest.warns(UserWarning, match="40 bytes of buffer for offloaded layers.*offload_buffers=True"):
            device_map = infer_auto_device_map(model, max_memory={0: 200, "cpu": 1000})
    assert device_map == {"first": 0, "norm": "cpu", "last": "cpu"}
    assert any("40 bytes of buffer" in record.getMessage() for record in caplog.records)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        infer_auto_device_map(model, max_memory={0: 200, "cpu": 1000}, offload_buffers=True)
        # 0 holds nothing (64 does not fit in 150 - 100) but keeps 100: 150 >= 40 + 100, no warning.
        with pytest.raises(UserWarning, match="insufficient memory"):
            infer_auto_device_map(model, max_memory={0: 150, "cpu": 1000})


def test_insufficient_memory_for_a_device_is_warned_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="accel_bigmodel.planning"):
        with pytest.warns(UserWarning, match="insufficient memory"):
            infer_auto_device_map(ThreeLayers(), max_memory={0: 10, "cpu": 1000})
    assert any("insufficient memory" in record.getMessage() for record in caplog.records)


def test_unexpected_checkpoint_keys_are_warned_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    import torch

    from accel_bigmodel.loading import check_checkpoint_matches

    expected = {"w": torch.zeros(2)}
    found = {"w": ((2,), torch.float32), "extra": ((1,), torch.float32)}
    with caplog.at_level(logging.WARNING, logger="accel_bigmodel.loading"):
        with pytest.warns(UserWarning, match="unexpected keys: extra"):
            check_checkpoint_matches(expected, found, [], strict=False, source="ckpt")
    assert "unexpected keys: extra" in caplog.text


def test_tied_parameters_on_different_devices_are_warned_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    from accel_bigmodel.tied import check_tied_parameters_on_same_device

    with caplog.at_level(logging.WARNING, logger="accel_bigmodel.tied"):
        with pytest.warns(UserWarning, match="different devices"):
            check_tied_parameters_on_same_device([["a.weight", "b.weight"]], {"a": 0, "b": "cpu"})
    assert "different devices" in caplog.text


def test_unknown_device_map_keys_raise() -> None:
    """A deliberate difference: the documented system only warns about device_map keys that name no
    module; accel refuses them (a typo would otherwise load weights to the wrong place)."""
    from accel_bigmodel.planning import check_device_map

    with pytest.raises(ValueError, match="names modules the model does not have"):
        check_device_map(ThreeLayers(), {"first": 0, "norm": 0, "last": 0, "lsat": 0})


# -- accel.commands.estimate: gather_data and verify_on_hub -----------------------------------------


def build_three_layers() -> nn.Module:
    return ThreeLayers()


def test_gather_data_gives_rows_indexable_like_the_documented_lists() -> None:
    from accel_bigmodel.commands import estimate as command

    args = command.estimate_command_parser().parse_args(
        ["test_bigmodel_parity:build_three_layers", "--dtypes", "float32", "int8"]
    )
    rows = command.gather_data(args)
    total = compute_module_sizes(ThreeLayers())[""]
    assert [row[0] for row in rows] == ["float32", "int8"]
    assert rows[0][2] == rows[0].total_size == total
    assert rows[1][2] == total // 4
    dtype, largest, size, training = rows[0]
    assert (dtype, largest, training) == ("float32", 100, 4 * size)


def test_verify_on_hub_says_gated_or_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("huggingface_hub")
    import huggingface_hub
    from huggingface_hub.utils import GatedRepoError, RepositoryNotFoundError

    from accel_bigmodel.commands.estimate import verify_on_hub

    def answer(error: Exception | None):  # type: ignore[no-untyped-def]
        def model_info(repo: str, token: str | None = None) -> object:
            if error is not None:
                raise error
            return {"id": repo, "token": token}

        return model_info

    monkeypatch.setattr(huggingface_hub, "model_info", answer(None))
    assert verify_on_hub("org/model", "tok") == {"id": "org/model", "token": "tok"}
    monkeypatch.setattr(huggingface_hub, "model_info", answer(OSError("offline")))
    assert verify_on_hub("org/model") == "gated"
    for error_class, expected in ((GatedRepoError, "gated"), (RepositoryNotFoundError, "repo")):
        error = error_class.__new__(error_class)
        Exception.__init__(error, "no access")
        monkeypatch.setattr(huggingface_hub, "model_info", answer(error))
        assert verify_on_hub("org/model") == expected


# -- layerwise casting ---------------------------------------------------------------------------


def test_layerwise_casting_skips_whole_subtrees_and_uses_the_documented_layers() -> None:
    import torch

    from accel_bigmodel.big_modeling import attach_layerwise_casting_hooks
    from accel_state.constants import SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING

    assert nn.Linear in SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING and nn.Conv2d in SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING
    assert nn.Embedding not in SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x)

    model = nn.Sequential(Block(), nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 4)))
    attach_layerwise_casting_hooks(
        model,
        storage_dtype=torch.bfloat16,
        compute_dtype=torch.float32,
        skip_modules_classes=(Block,),
        skip_modules_pattern=r"^2$",
    )
    assert model[0].inner.weight.dtype == torch.float32  # inside a skipped class: left alone
    assert model[2][0].weight.dtype == torch.float32  # inside a skipped name: left alone
    assert model[1].weight.dtype == torch.bfloat16  # stored low
    assert model(torch.randn(2, 4)).dtype == torch.float32  # computed high
    assert model[1].weight.dtype == torch.bfloat16
