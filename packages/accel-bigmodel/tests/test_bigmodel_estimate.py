"""The memory estimator and its command, the progress bar, and cheap imports."""

from __future__ import annotations

import subprocess
import sys

import pytest
from bigmodel_models import Net

from accel_bigmodel.commands import estimate as command
from accel_bigmodel.empty import init_empty_weights
from accel_bigmodel.estimate import convert_bytes, create_empty_model, estimate_memory, format_table
from accel_bigmodel.progress import progress
from accel_state.install_hints import install_hint


def build_net() -> Net:
    return Net(blocks=2)


def test_estimate_rows_per_dtype() -> None:
    with init_empty_weights():
        model = Net(blocks=2)
    rows = {r.dtype: r for r in estimate_memory(model)}
    total = sum(p.numel() for p in model.parameters()) * 4 + model.scale.numel() * 4
    assert rows["float32"].total_size == total
    assert rows["float16"].total_size == total // 2
    assert rows["int8"].total_size == total // 4
    assert rows["int4"].total_size == total // 8
    assert rows["float32"].training == 4 * total
    assert rows["float32"].largest_layer == 32 * 16 * 4  # the embedding (or the head)
    with pytest.raises(ValueError, match="float8"):
        estimate_memory(model, ["float8"])


def test_convert_bytes_and_table() -> None:
    assert convert_bytes(433_248_256) == "413.18 MB"
    assert convert_bytes(512) == "512 bytes"
    with init_empty_weights():
        rows = estimate_memory(Net(), ["float32"])
    table = format_table("net", rows)
    assert "Memory Usage for loading `net`" in table and "| float32 |" in table


def test_cli_main_with_a_factory(capsys: pytest.CaptureFixture[str]) -> None:
    assert command.main(["test_bigmodel_estimate:build_net", "--dtypes", "float32", "int4"]) == 0
    out = capsys.readouterr().out
    assert "float32" in out and "int4" in out and "float16" not in out


def test_cli_errors_are_clear(capsys: pytest.CaptureFixture[str]) -> None:
    assert command.main(["no_such_module_xyz:factory"]) == 1
    assert "no_such_module_xyz" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        command.main(["x", "--dtypes", "float64"])


def test_missing_library_names_the_extra(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    import accel_state.imports

    monkeypatch.setattr(accel_state.imports, "is_transformers_available", lambda: False)
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(ImportError) as info:
        create_empty_model(str(tmp_path))
    assert install_hint("accel-bigmodel", "transformers") in str(info.value)


@pytest.mark.parametrize("name", ["missing/config.json", "missing_folder", "./missing.json"])
def test_a_missing_path_is_said_not_to_exist(tmp_path, capsys: pytest.CaptureFixture[str], name: str) -> None:  # type: ignore[no-untyped-def]
    path = name if name.startswith(".") else str(tmp_path / name)
    assert command.main([path]) == 1
    err = capsys.readouterr().err
    assert f"{path!r} does not exist" in err and "has no config.json" not in err and "Hub (" not in err
    with pytest.raises(FileNotFoundError, match="does not exist"):  # the type Hugging Face Accelerate raises
        create_empty_model(path, library_name="transformers")


def test_an_existing_folder_without_config_json_says_so(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    assert command.main([str(tmp_path)]) == 1
    assert f"{str(tmp_path)!r} has no config.json" in capsys.readouterr().err


def test_add_parser_registers_estimate_memory() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    command.add_parser(sub)
    args = parser.parse_args(["estimate-memory", "bert-base-cased", "--library_name", "transformers"])
    assert args.func is command.run and args.dtypes == ["float32", "float16", "int8", "int4"]


def test_imports_do_not_load_torch() -> None:
    code = "import sys, accel_bigmodel, accel_bigmodel.commands.estimate; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_progress_only_when_asked_or_on_a_terminal() -> None:
    items = [1, 2, 3]
    assert progress(items) is items  # pytest captures stderr: not a terminal
    bar = progress(items, total=3, enabled=True)
    assert bar is not items and list(bar) == items


def test_cli_finds_a_factory_module_in_the_working_directory(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "my_local_models.py").write_text(
        "import torch\n\ndef build():\n    return torch.nn.Sequential(torch.nn.Linear(100, 100), torch.nn.Linear(100, 10))\n"
    )
    # the console script, as a user runs it: the working directory is not on sys.path there
    code = "import sys; from accel_bigmodel.commands.estimate import main; sys.exit(main(sys.argv[1:]))"
    result = subprocess.run(
        [sys.executable, "-I", "-c", code, "my_local_models:build", "--dtypes", "float32"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "my_local_models:build" in result.stdout


def test_documented_command_functions(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    parser = command.estimate_command_parser()
    args = parser.parse_args(["test_bigmodel_estimate:build_net", "--dtypes", "float32"])
    assert command.estimate_command(args) == 0
    assert "float32" in capsys.readouterr().out
    sub = argparse.ArgumentParser("accel").add_subparsers()
    assert command.estimate_command_parser(sub).prog.endswith("estimate-memory")
