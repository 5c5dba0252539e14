"""install_hint: the install line every error message prints (issue 37).

An accel distribution is not on the package index, so its hint is the repository form of the README
(folder, extra in brackets, constraints file); a third-party package gets the plain ``pip install``.
"""

from __future__ import annotations

import pathlib
import shlex

import pytest

import accel_state
from accel_state.install_hints import EXTRAS, install_hint

ROOT = pathlib.Path(__file__).resolve().parents[3]


def test_an_accel_extra_is_installed_from_the_repository_folder() -> None:
    hint = install_hint("accel-train", "deepspeed")
    assert hint == (
        'python3 -m pip install -c tools/constraints.txt "./packages/accel-train[deepspeed]" '
        "(from the root of a clone of the accel repository)"
    )
    command = hint.split(" (from the root")[0]
    assert shlex.split(command)[-1] == "./packages/accel-train[deepspeed]"  # one shell word, brackets kept


def test_an_accel_distribution_without_extra_is_its_bare_folder() -> None:
    hint = install_hint("accel-launch")
    assert hint.startswith("python3 -m pip install -c tools/constraints.txt ./packages/accel-launch (")
    assert " accel-launch" not in hint  # named only as the folder, never as an index name


def test_the_meta_package_never_becomes_the_unrelated_index_name() -> None:
    hint = install_hint("accel", "all")
    assert '"./packages/accel[all]"' in hint and "pip install accel" not in hint


def test_the_repository_form_is_the_one_the_readme_shows() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "python3 -m pip install -c tools/constraints.txt" in readme
    assert '"./packages/accel-train[deepspeed]"' in readme  # the README's spelling of an extra
    assert (ROOT / "tools" / "constraints.txt").is_file()


@pytest.mark.parametrize(
    ("requirement", "extra", "expected"),
    [
        ("lomo-optim", None, "pip install lomo-optim"),
        ("tqdm", None, "pip install tqdm"),
        ("deepspeed>=0.18.2", None, 'pip install "deepspeed>=0.18.2"'),
        ("ray", "train", 'pip install "ray[train]"'),
        ("megatron-core>=0.16,<0.17", None, 'pip install "megatron-core>=0.16,<0.17"'),
    ],
)
def test_a_third_party_package_is_a_plain_pip_install(requirement: str, extra: str | None, expected: str) -> None:
    assert install_hint(requirement, extra) == expected


def test_the_helper_is_exported_by_the_package() -> None:
    assert accel_state.install_hint is install_hint


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("",), r"distribution must be an accel distribution .* got ''"),
        (("two words",), r"got 'two words'"),
        (("accel-nope",), r"'accel-nope' is not an accel distribution; the distributions are \[.*'accel-train'"),
        (("accel-train[deepspeed]",), r"an extra goes in extra="),
        (("accel-train", "deepspeeed"), r"accel-train has no extra 'deepspeeed'; its extras are \['deepspeed'"),
        (("accel-state", "torch"), r"accel-state has no extra 'torch'; it declares no extras"),
        (("ray[train]", "tune"), r"already names its extras"),
        (("lomo-optim", "a b"), r"extra must be an extra's name .* got 'a b'"),
    ],
)
def test_bad_input_names_what_is_wrong(args: tuple[str, ...], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        install_hint(*args)


def test_the_extras_table_is_the_one_of_the_pyproject_files() -> None:
    tomllib = pytest.importorskip("tomllib")
    for distribution, extras in EXTRAS.items():
        path = ROOT / "packages" / distribution / "pyproject.toml"
        declared = tomllib.loads(path.read_text(encoding="utf-8"))["project"].get("optional-dependencies", {})
        assert sorted(extras) == sorted(set(declared) - {"test"}), distribution
    on_disk = {p.parent.name for p in (ROOT / "packages").glob("*/pyproject.toml")}
    assert set(EXTRAS) == on_disk
