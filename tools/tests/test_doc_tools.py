"""The guide's tools: the code-block runner, the docstring check and the guide builder's fence captions."""

from __future__ import annotations

import dataclasses
import enum
import pathlib
import sys
import textwrap
import types

import pytest

TOOLS = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TOOLS))

import build_guide  # noqa: E402
import check_docstrings  # noqa: E402
import run_doc_examples  # noqa: E402


def _page(tmp_path: pathlib.Path, text: str) -> pathlib.Path:
    page = tmp_path / "page.md"
    page.write_text(textwrap.dedent(text))
    return page


def test_blocks_are_found_with_their_line_language_and_attributes(tmp_path: pathlib.Path) -> None:
    page = _page(
        tmp_path,
        """\
        # Title

        ```python processes=2 run-if=json,os:path
        print(1)
        ```

        ~~~bash
        echo hi
        ~~~

        ```yaml file=conf.yaml
        a: 1
        ```

        ```text
        shown only
        ```
        """,
    )
    blocks = run_doc_examples.extract_blocks(page)
    assert [(b.line, b.language) for b in blocks] == [(3, "python"), (7, "bash"), (11, "yaml"), (15, "text")]
    assert blocks[0].attributes == {"processes": "2", "run-if": "json,os:path"} and blocks[0].code == "print(1)\n"
    assert [b.runnable for b in blocks] == [True, True, False, False]


def test_unknown_attribute_and_unclosed_block_are_errors(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ValueError, match=r"page.md:1: unknown code-block attribute\(s\) \['procs'\]"):
        run_doc_examples.extract_blocks(_page(tmp_path, "```python procs=2\nx\n```\n"))
    with pytest.raises(ValueError, match="never closed"):
        run_doc_examples.extract_blocks(_page(tmp_path, "```python\nx = 1\n"))


def test_run_if_conditions() -> None:
    assert run_doc_examples.unmet_condition("") is None
    assert run_doc_examples.unmet_condition("json, os:path") is None
    assert "not importable" in run_doc_examples.unmet_condition("json,no_such_module_xyz")
    assert run_doc_examples.unmet_condition("os:no_such_name") == "os has no no_such_name"


def test_a_page_runs_in_order_in_one_folder_and_failures_are_reported(tmp_path: pathlib.Path) -> None:
    page = _page(
        tmp_path,
        """\
        ```python file=helper.py
        VALUE = 41
        ```

        ```python
        import os
        from helper import VALUE
        assert os.environ["HF_HOME"].startswith(os.getcwd())
        open("out.txt", "w").write(str(VALUE + 1))
        ```

        ```bash
        test "$(cat out.txt)" = 42
        ```

        ```python run-if=no_such_module_xyz
        raise SystemExit("must not run")
        ```

        ```python
        raise SystemExit("boom")
        ```
        """,
    )
    outcomes = run_doc_examples.run_page(page)
    assert [o.status for o in outcomes] == ["written", "ran", "ran", "skipped", "failed"]
    assert "boom" in outcomes[-1].detail and "exit status 1" in outcomes[-1].detail
    assert run_doc_examples.main([str(page)]) == 1


def test_a_block_that_runs_too_long_is_stopped(tmp_path: pathlib.Path) -> None:
    page = _page(tmp_path, "```bash timeout=1\nsleep 30 &\nsleep 30\n```\n")
    (outcome,) = run_doc_examples.run_page(page)
    assert outcome.status == "failed" and "timed out after 1 s" in outcome.detail and outcome.seconds < 10


def test_docstring_check_finds_names_without_their_own_docstring(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("fake_package")

    def documented() -> None:
        """Has one."""

    def bare() -> None:
        pass

    class Parent:
        """Parent's text."""

    class Child(Parent):
        pass

    class Colour(enum.Enum):
        RED = 1

    @dataclasses.dataclass
    class Options:
        size: int = 1

    module.documented, module.bare, module.Child, module.Colour, module.Options = (
        documented,
        bare,
        Child,
        Colour,
        Options,
    )
    module.CONSTANT = 3
    module.__all__ = ["documented", "bare", "Child", "Colour", "Options", "CONSTANT"]
    monkeypatch.setitem(sys.modules, "fake_package", module)
    assert check_docstrings.undocumented("fake_package") == [
        "fake_package.bare",
        "fake_package.Child",
        "fake_package.Colour",
        "fake_package.Options",
    ]
    assert check_docstrings.main(["fake_package"]) == 1


def test_guide_builder_turns_runner_attributes_into_a_caption() -> None:
    text = "```python processes=2 run-if=accel_train.strategies.fsdp\nx\n```\n"
    out = build_guide.FENCE_WITH_ATTRIBUTES.sub(build_guide._caption, text)
    assert out.startswith('<p class="block">runs on 2 processes')
    assert "runs when <code>accel_train.strategies.fsdp</code> is available" in out
    assert "\n\n```python\nx\n```" in out
