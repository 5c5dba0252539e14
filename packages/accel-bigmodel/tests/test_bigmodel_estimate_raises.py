"""``estimate_command`` called from Python raises; the CLI prints one line and exits with status 1.

The types are those the documented system (accelerate 1.15, ``accelerate.commands.estimate``) raises for
the same input, observed by running it: ``OSError`` for a repository that is not on the Hub, gated, or
unreachable; ``ValueError`` for a name that cannot be a Hub id; ``RuntimeError`` when the library finds no
model to build; ``ImportError`` for a missing library (issue 37). Only the messages are accel's.
"""

from __future__ import annotations

import sys
import types

import pytest

from accel_bigmodel.commands import estimate as command
from accel_bigmodel.estimate import ModelBuildError, create_empty_model


def _args(name: str) -> object:
    return command.estimate_command_parser().parse_args([name, "--dtypes", "float32"])


def test_estimate_command_raises_and_the_cli_prints_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    args = _args("no_such_module_anywhere:build")
    with pytest.raises((ValueError, ImportError)):
        command.estimate_command(args)
    assert command.run(args) == 1
    err = capsys.readouterr().err
    assert err.startswith("accel estimate-memory:") and "no_such_module_anywhere" in err


class _NotFound(OSError):
    """Stands for huggingface_hub's RepositoryNotFoundError (an OSError there too)."""


class _Gated(_NotFound):
    """Stands for huggingface_hub's GatedRepoError (a RepositoryNotFoundError there too)."""


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch):
    """A stand-in ``huggingface_hub`` whose ``model_info`` raises what the test sets (installed or not)."""
    failure: dict[str, BaseException] = {}

    def model_info(repo: str, token: str | None = None) -> object:
        raise failure["error"]

    module = types.ModuleType("huggingface_hub")
    module.model_info = model_info  # type: ignore[attr-defined]
    utils = types.ModuleType("huggingface_hub.utils")
    utils.RepositoryNotFoundError = _NotFound  # type: ignore[attr-defined]
    utils.GatedRepoError = _Gated  # type: ignore[attr-defined]
    module.utils = utils  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "huggingface_hub", module)
    monkeypatch.setitem(sys.modules, "huggingface_hub.utils", utils)
    import accel_state.imports

    monkeypatch.setattr(accel_state.imports, "is_huggingface_hub_available", lambda: True)
    return failure


@pytest.mark.parametrize(
    ("error", "raised", "match"),
    [
        (_NotFound("404"), OSError, "'someone/nothing' is not a model on the Hub"),
        (_Gated("403"), OSError, "'someone/nothing' is gated on the Hub"),
        (ConnectionError("offline"), OSError, r"Cannot look 'someone/nothing' up on the Hub \(ConnectionError"),
        (ValueError("Repo id must be in the form"), ValueError, "neither a Hub model id nor a local config"),
    ],
)
def test_hub_failures_raise_the_documented_types(
    hub: dict, capsys: pytest.CaptureFixture[str], error: BaseException, raised: type, match: str
) -> None:
    hub["error"] = error
    with pytest.raises(raised, match=match) as caught:
        command.estimate_command(_args("someone/nothing"))
    assert raised is ValueError or not isinstance(caught.value, ValueError)  # OSError here, not the old ValueError
    assert command.run(_args("someone/nothing")) == 1
    assert capsys.readouterr().err.count("\n") == 1


def test_a_missing_local_config_file_is_file_not_found(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = str(tmp_path / "nowhere" / "config.json")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        create_empty_model(missing)
    with pytest.raises(FileNotFoundError, match=r"empty.config\.json' does not exist"):
        (tmp_path / "empty").mkdir()
        create_empty_model(str(tmp_path / "empty"))
    assert command.run(_args(missing)) == 1 and "does not exist" in capsys.readouterr().err


def test_a_config_transformers_cannot_build_is_a_runtime_error(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers")
    (tmp_path / "config.json").write_text('{"hidden_size": 4}')  # no model_type: no model to build
    with pytest.raises(ModelBuildError, match="transformers found no model to build") as caught:
        create_empty_model(str(tmp_path), library_name="transformers")
    assert isinstance(caught.value, RuntimeError)
    assert command.run(_args(str(tmp_path))) == 1
    assert "found no model to build" in capsys.readouterr().err
