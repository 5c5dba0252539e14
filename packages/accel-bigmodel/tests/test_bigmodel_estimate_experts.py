"""``accel estimate-memory --ep_size N``: per-process bytes of a mixture-of-experts model's experts and of
the rest, through the real command (a transformers config folder, or a ``package.module:factory``)."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pytest
from moe_models import build_list_moe, build_transformers_moe, transformers_moe_config
from torch import nn

from accel_bigmodel.commands import estimate as command
from accel_bigmodel.empty import init_empty_weights
from accel_bigmodel.estimate import convert_bytes, create_empty_model, estimate_memory, format_table
from accel_bigmodel.expert_estimate import ExpertParallelRow, check_ep_size, estimate_expert_parallel_memory
from accel_bigmodel.sizes import compute_module_sizes

needs_transformers = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None, reason="transformers is not installed"
)


def _config_folder(tmp_path: Path, kind: str) -> str:
    """A folder holding only the ``config.json`` of a tiny transformers mixture-of-experts model."""
    transformers_moe_config(kind).to_json_file(str(tmp_path / "config.json"))
    return str(tmp_path)


def _bytes(model: nn.Module, marker: str) -> tuple[int, int]:
    """(bytes of the parameters whose name holds ``marker``, bytes of everything) in float32, counted here
    by name, independently of the expert-module search."""
    experts = sum(p.numel() * 4 for n, p in model.named_parameters() if marker in n)
    return experts, compute_module_sizes(model)[""] * 4 // next(model.parameters()).element_size()


def _row_line(out: str, dtype: str) -> list[str]:
    line = next(line for line in out.splitlines() if line.startswith(f"| {dtype} "))
    return [cell.strip() for cell in line.strip("|").split("|")]


@needs_transformers
@pytest.mark.parametrize(("kind", "ep_size"), [("qwen3_moe", 2), ("mixtral", 4), ("gpt_oss", 2)])
def test_a_transformers_config_folder_reports_experts_per_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, ep_size: int
) -> None:
    folder = _config_folder(tmp_path, kind)
    experts, total = _bytes(create_empty_model(folder), ".mlp.experts.")
    assert experts > 0
    assert command.main([folder, "--ep_size", str(ep_size), "--dtypes", "float32", "int8"]) == 0
    out = capsys.readouterr().out
    assert f"with its experts split over {ep_size} processes" in out
    assert "| dtype   | Experts" in out and "Largest Layer" not in out
    for dtype, divisor in (("float32", 1), ("int8", 4)):
        held, rest = experts // ep_size // divisor, (total - experts) // divisor
        assert _row_line(out, dtype) == [
            dtype,
            convert_bytes(held),
            convert_bytes(rest),
            convert_bytes(held + rest),
            convert_bytes(4 * (held + rest)),
        ]
    args = command.estimate_command_parser().parse_args([folder, "--ep_size", str(ep_size), "--dtypes", "float32"])
    held, rest = experts // ep_size, total - experts
    assert command.gather_data(args) == [ExpertParallelRow("float32", held, rest, held + rest, 4 * (held + rest))]


def test_a_user_list_block_factory_reports_experts_per_process(capsys: pytest.CaptureFixture[str]) -> None:
    with init_empty_weights():
        experts, total = _bytes(build_list_moe(), ".experts.mlps.")
    assert command.main(["moe_models:build_list_moe", "--ep_size", "4", "--dtypes", "float32"]) == 0
    held, rest = experts // 4, total - experts
    assert _row_line(capsys.readouterr().out, "float32")[1:4] == [
        convert_bytes(held),
        convert_bytes(rest),
        convert_bytes(held + rest),
    ]


@pytest.mark.parametrize("flags", [[], ["--ep_size", "1"]], ids=["no flag", "ep_size 1"])
@pytest.mark.parametrize("factory", ["moe_models:build_stacked_moe", "moe_models:build_dense"])
def test_without_ep_size_the_table_is_the_ordinary_one(
    capsys: pytest.CaptureFixture[str], flags: list[str], factory: str
) -> None:
    assert command.main([factory, *flags]) == 0
    model = create_empty_model(factory)
    assert capsys.readouterr().out == format_table(factory, estimate_memory(model)) + "\n"


def test_gather_data_without_an_ep_size_attribute_gives_the_documented_rows() -> None:
    # a namespace built by hand, as callers of the documented gather_data did before --ep_size existed
    args = argparse.Namespace(
        model_name="moe_models:build_stacked_moe", library_name=None, trust_remote_code=False, dtypes=["float32"]
    )
    rows = command.gather_data(args)
    assert rows == estimate_memory(create_empty_model(args.model_name), ["float32"])
    assert len(rows[0]) == 4


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5"])
def test_an_ep_size_below_one_or_not_an_integer_is_refused_by_name(
    capsys: pytest.CaptureFixture[str], value: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        command.main(["moe_models:build_stacked_moe", "--ep_size", value])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --ep_size: must be an integer >= 1" in err and repr(value) in err


@pytest.mark.parametrize("value", [0, -1, True, 2.0, "2"])
def test_the_python_api_refuses_a_bad_ep_size(value: object) -> None:
    with pytest.raises(ValueError, match=r"ep_size \(--ep_size\) must be an integer >= 1"):
        check_ep_size(value)
    with init_empty_weights():
        model = build_list_moe()
    with pytest.raises(ValueError, match="must be an integer >= 1"):
        estimate_expert_parallel_memory(model, value)  # type: ignore[arg-type]


def test_an_ep_size_that_does_not_divide_an_expert_count_names_the_module(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # 4 stacked experts in blocks.0, 6 listed ones in blocks.1: 4 divides the first only
    assert command.main(["moe_models:build_uneven_moe", "--ep_size", "4"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("accel estimate-memory: ")
    assert "ep_size=4 (--ep_size) does not divide the 6 experts of 'blocks.1.experts'" in err
    assert "choose one of [1, 2]" in err and "more expert modules" not in err
    args = command.estimate_command_parser().parse_args(["moe_models:build_uneven_moe", "--ep_size", "5"])
    with pytest.raises(ValueError, match=r"the 4 experts of 'blocks.0.experts' \(nor those of 1 more expert"):
        command.estimate_command(args)
    assert command.main(["moe_models:build_uneven_moe", "--ep_size", "2", "--dtypes", "int4"]) == 0


@needs_transformers
def test_an_ep_size_that_does_not_divide_a_transformers_model_names_its_first_layer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert command.main([_config_folder(tmp_path, "qwen3_moe"), "--ep_size", "3"]) == 1
    err = capsys.readouterr().err
    assert "does not divide the 4 experts of 'model.layers.0.mlp.experts' (nor those of 1 more" in err
    assert "choose one of [1, 2, 4]" in err


def test_an_ep_size_above_one_for_a_dense_model_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert command.main(["moe_models:build_dense", "--ep_size", "2"]) == 1
    err = capsys.readouterr().err
    assert "ep_size=2 (--ep_size)" in err and "'moe_models:build_dense' has no expert module" in err
    with pytest.raises(ValueError, match="the model has no expert module"):
        estimate_expert_parallel_memory(create_empty_model("moe_models:build_dense"), 2)


@needs_transformers
def test_split_and_ordinary_estimates_agree_at_ep_size_one() -> None:
    model = build_transformers_moe("gpt_oss")
    whole = {r.dtype: r for r in estimate_memory(model)}
    for row in estimate_expert_parallel_memory(model, 1):
        # int4 divides the two parts separately: they may lose a byte each to rounding
        assert 0 <= whole[row.dtype].total_size - row.total_size <= 1
        assert row.training == 4 * row.total_size
    halves = {r.dtype: r for r in estimate_expert_parallel_memory(model, 2)}
    ones = {r.dtype: r for r in estimate_expert_parallel_memory(model, 1)}
    assert all(halves[d].experts * 2 == ones[d].experts and halves[d].rest == ones[d].rest for d in ones)
