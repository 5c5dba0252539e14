"""The documentation tools: code-block runner, docstring ratchet, site hooks and checks, browser check."""

from __future__ import annotations

import dataclasses
import enum
import pathlib
import sys
import tempfile
import textwrap
import types

import pytest

TOOLS = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TOOLS))

import build_guide  # noqa: E402
import check_browser  # noqa: E402
import check_docstrings  # noqa: E402
import check_site  # noqa: E402
import devtools_pipe  # noqa: E402
import docs_hooks  # noqa: E402
import run_doc_examples  # noqa: E402
from docs_site import api_markdown, examples_note, llms, pictures  # noqa: E402


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


def test_pages_run_two_at_a_time_and_are_reported_in_page_order(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mark = tmp_path / "second-ran"
    first = tmp_path / "first.md"  # waits (10 s at most) for the second page: only passes side by side
    first.write_text(f"```bash\nfor i in $(seq 100); do [ -f {mark} ] && break; sleep 0.1; done\ntest -f {mark}\n```\n")
    second = tmp_path / "second.md"
    second.write_text(f"```bash\ntouch {mark}\n```\n")
    assert run_doc_examples.main([str(first), str(second), "--jobs", "2"]) == 0
    printed = capsys.readouterr().out
    assert printed.index("first.md") < printed.index("second.md")  # page order, though the second ended first
    assert "2 ran, 0 skipped, 0 failed over 2 pages" in printed
    with pytest.raises(SystemExit):
        run_doc_examples.main([str(first), "--jobs", "0"])


def _fake_package(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("fake_package")
    module.__name__ = "fake_package"

    def documented(size: int, *, name: str = "x") -> None:
        """Has one.

        Args:
            size: How many.
            name (str): What it is called.
        """

    def half(size: int, colour: str) -> None:
        """Documents one argument of two.

        Args:
            size: How many.

        Returns:
            Nothing.
        """

    def bare() -> None:
        pass

    class Parent:
        """Parent's text.

        Args:
            width: How wide.
        """

        def __init__(self, width: int, _private: int = 0) -> None:
            self.width = width

        def method(self, value: int) -> int:
            """Doubles.

            Args:
                value: The number.
            """
            return 2 * value

        @property
        def area(self) -> int:
            return self.width

    class Child(Parent):
        pass

    class Colour(enum.Enum):
        RED = 1

    @dataclasses.dataclass
    class Options:
        """Options.

        Attributes:
            size: How many.
        """

        size: int = 1
        depth: int = 2

    for value in (documented, half, bare, Parent, Child, Colour, Options):
        value.__module__ = "fake_package"
        setattr(module, value.__name__, value)
    Parent.method.__module__ = Parent.area.fget.__module__ = Parent.__init__.__module__ = "fake_package"
    Options.__init__.__module__ = "fake_package"
    module.CONSTANT = 3
    module.__all__ = ["documented", "half", "bare", "Parent", "Child", "Colour", "Options", "CONSTANT"]
    monkeypatch.setitem(sys.modules, "fake_package", module)
    monkeypatch.setitem(check_docstrings.DISTRIBUTIONS, "fake_package", "fake")


def test_docstring_check_counts_members_and_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_package(monkeypatch)
    members, broken = check_docstrings.collect(("fake_package",))
    by_path = {m.path.removeprefix("fake_package."): m for m in members}
    assert broken == []
    # Child is its own public class without a docstring; Parent's members are counted once, under Parent
    assert set(by_path) == {
        "documented",
        "half",
        "bare",
        "Parent",
        "Parent.method",
        "Parent.area",
        "Child",
        "Colour",
        "Options",
    }
    assert by_path["documented"].undocumented_arguments == []
    assert by_path["half"].undocumented_arguments == ["colour"]
    assert by_path["Parent"].arguments == ["width"] and by_path["Parent"].undocumented_arguments == []
    assert by_path["Options"].undocumented_arguments == ["depth"]
    assert [name for name, m in by_path.items() if not m.has_docstring] == ["bare", "Parent.area", "Child", "Colour"]
    row = check_docstrings.figures(members)["fake"]
    assert row == {"members": 9, "documented_members": 5, "arguments": 8, "documented_arguments": 6}


def test_docstring_ratchet_fails_only_on_new_gaps(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    _fake_package(monkeypatch)
    monkeypatch.setattr(check_docstrings, "ROOTS", ("fake_package",))
    monkeypatch.setattr(check_docstrings, "DISTRIBUTIONS", {"fake_package": "fake"})
    baseline = tmp_path / "baseline.json"
    assert check_docstrings.main(["--baseline", str(baseline), "--update-baseline"]) == 0
    assert check_docstrings.main(["--baseline", str(baseline)]) == 0
    baseline.write_text(baseline.read_text().replace('"undocumented_arguments": 2', '"undocumented_arguments": 1'))
    assert check_docstrings.main(["--baseline", str(baseline)]) == 1  # one gap more than allowed
    worse, better = check_docstrings.compare({"d": {"x": 1}}, {"d": {"x": 3}})
    assert worse == [] and better == ["d: 1 x (baseline 3)"]


def test_google_sections_are_parsed_at_their_own_indentation() -> None:
    doc = """Summary.

    Args:
        first (int): One.
            continued: not an argument.
        *args: Extra.
        **kwargs: More.

    Returns:
        value: not an argument either.
    """
    assert check_docstrings.documented_names(doc) == {"first", "args", "kwargs"}


def test_guide_builder_turns_runner_attributes_into_a_caption() -> None:
    text = "```python processes=2 run-if=accel_train.strategies.fsdp\nx\n```\n"
    out = build_guide.FENCE_WITH_ATTRIBUTES.sub(build_guide._caption, text)
    assert out.startswith('<p class="block">runs on 2 processes')
    assert "runs when <code>accel_train.strategies.fsdp</code> is available" in out
    assert "\n\n```python\nx\n```" in out
    indented = "1. step\n\n    ```bash file=run.sh\n    echo\n    ```\n"
    assert (
        '    <p class="block">file <code>run.sh</code></p>\n\n    ```bash\n'
        in build_guide.FENCE_WITH_ATTRIBUTES.sub(build_guide._caption, indented)
    )


def test_inline_code_links_to_the_reference_outside_code_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(docs_hooks, "_link_targets", lambda: {"save_state": "pkg.A.save_state", "accel.X": "pkg.X"})
    text = "Call `save_state()` or `accel.X`, not `other`.\n# `save_state` heading\n```python\n`save_state`\n```\n[`save_state`](x.md)\n"
    out = docs_hooks.link_inline_code(text)
    assert out.splitlines()[0] == "Call [`save_state()`][pkg.A.save_state] or [`accel.X`][pkg.X], not `other`."
    assert out.splitlines()[1:] == text.splitlines()[1:]


def test_nav_gets_the_pages_it_does_not_list(tmp_path: pathlib.Path) -> None:
    for name in ("index.md", "a.md", "new-page.md"):
        (tmp_path / name).write_text("# t\n")
    config = {"docs_dir": str(tmp_path), "nav": [{"Home": "index.md"}, {"Guide": ["a.md"]}, {"Reference": ["r.md"]}]}
    assert docs_hooks.on_config(config)["nav"][1] == {"Guide": ["a.md", "new-page.md"]}


def test_site_check_reads_entries_and_their_descriptions() -> None:
    parser = check_site._Entries()
    parser.feed(
        '<div class="doc"><h2 id="p.f" class="doc-heading">f</h2><div class="doc-contents"><p>Does it.</p></div></div>'
        '<div class="doc"><h3 id="p.g" class="doc-heading">g</h3><div class="doc-contents"> </div></div>'
    )
    assert {"p.f", "p.g"} <= parser.ids
    assert parser.descriptions["p.f"].strip() == "Does it." and not parser.descriptions["p.g"].strip()


def test_layer_diagram_follows_the_pyproject_dependencies(tmp_path: pathlib.Path) -> None:
    for name, deps in (("accel-a", []), ("accel-b", ["accel-a>=0.1"]), ("accel-c", ["accel-b", "torch"])):
        (tmp_path / name).mkdir()
        (tmp_path / name / "pyproject.toml").write_text(f"[project]\nname = {name!r}\ndependencies = {deps!r}\n")
    svg = pictures.layers_svg(tmp_path)
    assert svg.startswith("<svg") and svg.count("<rect") == 3 and svg.count("<line") == 2
    assert pictures._layers(pictures._requires(tmp_path)) == {"accel-a": 0, "accel-b": 1, "accel-c": 2}


def test_benchmark_section_says_so_when_there_are_no_results(tmp_path: pathlib.Path) -> None:
    text, files = pictures.benchmark_files(tmp_path / "none.jsonl")
    assert "No benchmark results" in text and files == {}
    results = tmp_path / "r.jsonl"
    results.write_text(
        '{"script": "s", "label": "accel vs plain", "ratio": 1.5}\n{"script": "s", "label": "accel vs plain", "ratio": 0.9}\n'
        '{"script": "s", "label": "zero", "ratio": null}\n'
    )
    assert [r["ratio"] for r in pictures.read_results(results)] == [0.9]  # the latest record of a label


def test_benchmark_rows_say_where_they_ran_and_whether_they_meet_their_goal() -> None:
    machine = {"cores": 2, "cpu": "Some CPU", "gpu": None, "python": "3.11.7", "torch": "2.13.0", "accel": "0.9.0",
               "system": "Linux-6"}  # fmt: skip
    records = [
        {"script": "load", "label": "accel vs raw", "value": 0.3, "baseline": 0.2, "ratio": 1.5, "unit": "s",
         "goal": "<= 1.2", "time": "2026-11-28T10:00:00", "machine": machine},
        {"script": "steps", "label": "prepared | plain", "value": 9.9, "baseline": 10.0, "ratio": 0.99,
         "unit": "steps/s", "goal": ">= 0.97", "time": "2026-11-28T11:00:00", "machine": machine},
    ]  # fmt: skip
    line = pictures._machine_line(records)
    assert "between 2026-11-28T10:00:00 and 2026-11-28T11:00:00 on 2 CPU cores (Some CPU), no GPU" in line
    assert "torch 2.13.0" in line and "accel 0.9.0" in line
    table = pictures.results_table(records).splitlines()
    assert table[2] == "| `load` | accel vs raw | 0.3 s | 0.2 s | 1.500 | <= 1.2 | no | CPU |"
    assert table[3] == "| `steps` | prepared \\| plain | 9.9 steps/s | 10 steps/s | 0.990 | >= 0.97 | yes | CPU |"
    # a rate below its baseline is worse, a time below its baseline better
    assert not pictures._better_than_baseline(records[1]) and pictures._better_than_baseline(
        {**records[0], "ratio": 0.9}
    )
    assert pictures._unmeasured_gpu(records) == [
        f"`tools/bench/gpu_train_loop.py`: {pictures.GPU_BENCHMARKS['gpu_train_loop']}"
    ]
    on_gpu = [{**records[0], "script": "gpu_train_loop", "machine": {**machine, "gpu": "NVIDIA H200"}}]
    assert pictures._unmeasured_gpu(on_gpu) == [] and pictures.results_table(on_gpu).endswith("| GPU |")
    assert "several machines" in pictures._machine_line([*records, *on_gpu])
    theirs = [{**records[0], "label": "reference: call vs raw", "ratio": 9.0}]  # the goal beside it is accel's
    assert pictures.results_table(theirs).splitlines()[2].endswith("| 9.000 |  |  | CPU |")
    assert pictures._machine_line([{**records[0], "machine": None}]) == (
        "Measured at 2026-11-28T10:00:00 on a machine the records do not describe."
    )


def test_browser_check_finds_marks_in_a_real_page(tmp_path: pathlib.Path) -> None:
    browser = check_browser.find_browser()
    if browser is None:
        pytest.skip("no chromium installed (apt-get install -y chromium)")
    (tmp_path / "index.html").write_text(
        '<html><body><nav class="md-nav md-nav--primary">x</nav><script>document.body.insertAdjacentHTML('
        '"beforeend", \'<input class="md-search__input">\')</script>' + "<p>text</p>" * 200 + "</body></html>"
    )
    with check_browser.serve(tmp_path) as base:
        marks = {"sidebar": 'class="md-nav md-nav--primary"', "search box": 'class="md-search__input"'}
        assert check_browser.check_page(browser, base + "index.html", marks, tmp_path / "shot.png") == []
        missing = check_browser.check_page(browser, base + "index.html", {"x": "no-such-mark"}, tmp_path / "b.png")
    assert missing and "no x" in missing[0]
    assert (tmp_path / "shot.png").stat().st_size > 5000


def test_old_html_links_point_at_the_markdown_pages(tmp_path: pathlib.Path) -> None:
    (tmp_path / "launching.md").write_text("# t\n")
    text = "See [launching](launching.html#flags), [data](accel-data.html) and [x](nowhere.html)."
    assert docs_hooks.md_links(text, tmp_path) == (
        "See [launching](launching.md#flags), [data](packages/accel-data.md) and [x](nowhere.html)."
    )


# --- search from disk, Markdown twins, llms.txt, the examples note ---------------------------------


def test_twin_of_a_page_sits_beside_it() -> None:
    assert llms.twin_path("quicktour.html") == "quicktour.md"
    assert llms.twin_path("reference/index.html") == "reference/index.md"
    with pytest.raises(ValueError, match=r"ends with \.html.*got 'quicktour\.md'"):
        llms.twin_path("quicktour.md")


def test_twin_markdown_drops_site_syntax_outside_code_blocks() -> None:
    text = (
        "## accel launch { #accel-launch }\n"
        '<p class="accel-import"><code>from accel import X</code> (defined in <code>a.b</code>)</p>\n'
        "```html\n<p><code>kept</code></p>\n## not a heading { #x }\n```\n"
    )
    assert llms.plain_markdown(text) == (
        "## accel launch\n`from accel import X` (defined in `a.b`)\n"
        "```html\n<p><code>kept</code></p>\n## not a heading { #x }\n```\n"
    )


def test_page_description_is_the_first_sentence_of_prose() -> None:
    page = (
        "# Title\n\n!!! note\n\n```python\n# A comment. Not prose.\n```\n\n"
        "Reads [the data](data.md) from `disk`. Then more.\nAnd more.\n\n## Next\n\nOther.\n"
    )
    assert llms.describe(page) == "Reads the data from `disk`."
    assert llms.describe("# Only a title\n\n```python\nx = 1\n```\n") == ""
    assert llms.describe("A run stops, e.g. on preemption. accel resumes it.") == "A run stops, e.g. on preemption."
    assert llms.describe("*An extension (`pp_size`). Off by default.*") == "An extension (`pp_size`)."
    assert llms.describe("Uses `__init__` and snake_case_names.") == "Uses `__init__` and snake_case_names."
    described = llms.describe("# T\n\n" + "word " * 100 + "end.\n", limit=40)
    assert described.endswith("…") and len(described) <= 40 and described.startswith("word word")


def test_note_goes_after_the_title_not_after_a_comment_in_code() -> None:
    text = "```bash\n# not the title\n```\n# Title\n\nBody.\n"
    assert llms.insert_after_title(text, "> note\n") == "```bash\n# not the title\n```\n# Title\n\n> note\n\nBody.\n"
    assert llms.insert_after_title("No title.\n", "> note\n") == "> note\n\nNo title.\n"


def _pages() -> list[llms.Page]:
    return [
        llms.Page("Home", "index.md", "# Home\n\nStart here. Then go on.\n", llms.TOP_SECTION),
        llms.Page(
            "Quick tour", "quicktour.md", "# Quick tour\n\n> note\n", "Guide", "A loop on any number of processes."
        ),
        llms.Page("Accelerator", "reference/accelerator.md", "# Accelerator\n\nThe object.\n", "Reference"),
    ]


def test_llms_txt_lists_every_page_under_its_section() -> None:
    text = llms.llms_txt("accel", "One script,\n  many machines.", _pages())
    assert text.startswith("# accel\n\n> One script, many machines.\n\n")
    assert "\n## Start\n\n- [Home](index.md): Start here.\n" in text
    assert "\n## Guide\n\n- [Quick tour](quicktour.md): A loop on any number of processes.\n" in text
    assert "\n## Reference\n\n- [Accelerator](reference/accelerator.md): The object.\n" in text
    assert "\n\n\n" not in text
    assert llms.linked_files(text) == {"index.md", "quicktour.md", "reference/accelerator.md"}
    with pytest.raises(ValueError, match="needs a title"):
        llms.llms_txt(" ", "summary", _pages())


def test_llms_full_txt_holds_every_twin_in_order() -> None:
    text = llms.llms_full_txt("accel", "Summary.", _pages())
    assert text.startswith("# accel\n\n> Summary.\n")
    positions = [text.index(f"<!-- {page.twin} -->\n\n{page.markdown.strip()}") for page in _pages()]
    assert positions == sorted(positions)


def test_examples_note_counts_what_the_runner_runs(tmp_path: pathlib.Path) -> None:
    page = _page(
        tmp_path,
        "# T\n\n```python\nx = 1\n```\n\n```bash run-if=cuda\necho\n```\n\n```python file=a.py\ny = 2\n```\n\n"
        "```text\nshown\n```\n",
    )
    count = examples_note.count_examples(run_doc_examples.extract_blocks(page))
    assert count == examples_note.ExampleCount(runnable=2, conditional=1)
    versions = {"accel": "1.2.3", "torch": "2.13.0"}
    text = examples_note.sentence(count, versions)
    assert text.startswith("The 2 runnable examples on this page run in CI (1 of them only where")
    assert text.endswith("built with: accel 1.2.3, torch 2.13.0.")
    assert examples_note.sentence(examples_note.ExampleCount(1, 0), versions).startswith(
        "The runnable example on this page runs in CI, by"
    )
    assert examples_note.admonition(count, versions).startswith(
        '!!! note ci-examples "Examples run in CI"\n\n    The 2'
    )
    with pytest.raises(ValueError, match="only when an example of it runs; got 0"):
        examples_note.sentence(examples_note.ExampleCount(0, 0), versions)
    assert examples_note.runs_examples(page, [tmp_path / "other.md", tmp_path / "." / "page.md"])
    assert not examples_note.runs_examples(page, [tmp_path / "other.md"])


def test_build_versions_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "fake_versioned", types.SimpleNamespace(__version__="9.8.7"))
    assert examples_note.installed_version("fake-versioned") == "9.8.7"
    assert examples_note.installed_version("pytest", module="no_such_module_xyz") == pytest.__version__
    with pytest.raises(LookupError, match="cannot tell which no-such-dist-xyz the examples run against"):
        examples_note.installed_version("no-such-dist-xyz")
    # the real names, read from modules (here stand-ins, so that the tools' session needs neither installed)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(__version__="2.99.0+cpu"))
    monkeypatch.setitem(sys.modules, "accel", types.SimpleNamespace(__version__="0.99.0"))
    assert examples_note.build_versions() == {"accel": "0.99.0", "torch": "2.99.0+cpu"}


def test_the_runner_and_the_note_share_the_list_of_pages(tmp_path: pathlib.Path) -> None:
    (tmp_path / "docs").mkdir()
    for name in ("b.md", "a.md", "notes.txt"):
        (tmp_path / "docs" / name).write_text("# t\n")
    assert run_doc_examples.default_pages(tmp_path) == [tmp_path / "docs" / "a.md", tmp_path / "docs" / "b.md"]


def test_reference_directives_are_read_with_their_options() -> None:
    text = (
        '# Page\n\n::: pkg.mod.Thing\n    options:\n      heading: "accel.Thing"\n\n      members:\n        - go\n'
        "\nAfter.\n\n```markdown\n::: not.a.directive\n```\n::: pkg.other\n"
    )
    assert api_markdown.split_directives(text) == [
        "# Page\n\n",
        ("pkg.mod.Thing", {"heading": "accel.Thing", "members": ["go"]}),
        "\nAfter.\n\n```markdown\n::: not.a.directive\n```\n",
        ("pkg.other", {}),
    ]
    with pytest.raises(ValueError, match="options of '::: pkg.x' are not valid YAML"):
        api_markdown.split_directives("::: pkg.x\n    options: [unclosed\n")
    with pytest.raises(ValueError, match="options of '::: pkg.x' must be a mapping"):
        api_markdown.split_directives("::: pkg.x\n    - a list\n")


THING = '''
class Thing:
    """A thing.

    Args:
        size: How big.
        name: What it is called.
    """

    def __init__(self, size: int, name: str = "x") -> None:
        self.size = size

    def go(self, steps: int = 1) -> int:
        """Move.

        Returns:
            Where it ended.

        Raises:
            ValueError: if steps is negative.
        """
        return steps

    def _hidden(self) -> None:
        """Not shown."""
'''


def test_reference_directives_become_markdown_of_the_code() -> None:
    import griffe

    with griffe.temporary_visited_module(THING, module_name="pkg", docstring_parser=griffe.Parser.google) as module:
        out = api_markdown.expand_directives(
            '# Ref\n\n::: pkg.Thing\n    options:\n      heading: "accel.Thing"\n\nEnd.\n',
            lambda identifier: module.get_member(identifier.removeprefix("pkg.")),
        )
    assert out.startswith("# Ref\n\n## accel.Thing\n\n*class* `pkg.Thing`\n\n```python\nThing(size: int, name: str = ")
    assert "- `size` (`int`): How big.\n- `name` (`str`, default `'x'`): What it is called." in out
    assert "### accel.Thing.go\n\n*method* `pkg.Thing.go`\n\n```python\ngo(steps: int = 1) -> int\n```" in out
    assert "**Returns:**\n\n- `int`: Where it ended." in out and "- `ValueError`: if steps is negative." in out
    assert "_hidden" not in out and out.rstrip().endswith("End.")


def test_reference_resolver_names_what_it_cannot_find() -> None:
    resolve = api_markdown.griffe_resolver(["json"])
    assert resolve("json.dumps").name == "dumps"
    with pytest.raises(LookupError, match=r"'json.no_such_name', which is not in the packages loaded \(json\)"):
        resolve("json.no_such_name")


def _fake_page(uri: str, title: str) -> types.SimpleNamespace:
    file = types.SimpleNamespace(src_uri=uri, dest_uri=uri.removesuffix(".md") + ".html")
    return types.SimpleNamespace(file=file, title=title, is_page=True, children=None)


def test_hooks_write_twins_and_llms_files_the_site_check_accepts(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs, site = tmp_path / "docs", tmp_path / "site"
    docs.mkdir()
    (docs / "tour.md").write_text("# Tour\n\nRuns a loop.\n\n```python\nprint(1)\n```\n")
    (docs / "index.md").write_text("# Home\n\nThe start.\n")
    monkeypatch.setattr(run_doc_examples, "default_pages", lambda root=None: sorted(docs.glob("*.md")))
    monkeypatch.setattr(docs_hooks, "_versions", lambda: {"accel": "1.0", "torch": "2.0"})
    monkeypatch.setattr(docs_hooks, "_link_targets", lambda: {})  # the reference's names need accel installed
    config = {"docs_dir": str(docs), "site_dir": str(site), "site_name": "accel", "site_description": "Sum.", "nav": []}
    docs_hooks.on_config(config)
    home, tour = _fake_page("index.md", "Home"), _fake_page("tour.md", "Tour")
    html_tour = docs_hooks.on_page_markdown((docs / "tour.md").read_text(), tour, config, None)
    html_home = docs_hooks.on_page_markdown((docs / "index.md").read_text(), home, config, None)
    assert '!!! note ci-examples "Examples run in CI"' in html_tour and "ci-examples" not in html_home
    guide = types.SimpleNamespace(title="Guide", children=[tour], is_page=False)
    docs_hooks.on_nav(types.SimpleNamespace(items=[home, guide]), config, None)
    site.mkdir()
    for page in ("index.html", "tour.html"):
        (site / page).write_text("<html></html>")
    docs_hooks.on_post_build(config)
    twin = (site / "tour.md").read_text()
    assert twin.startswith("# Tour\n\n> **Examples run in CI.** The runnable example on this page runs in CI")
    assert "accel 1.0, torch 2.0" in twin
    listed = (site / "llms.txt").read_text()
    assert "## Start\n\n- [Home](index.md): The start.\n" in listed
    assert "## Guide\n\n- [Tour](tour.md): Runs a loop.\n" in listed
    assert check_site.check_tool_files(site) == []
    (site / "extra.html").write_text("<html></html>")
    assert check_site.check_tool_files(site) == [
        "extra.html: no Markdown twin extra.md",
        "extra.html: llms.txt does not list its twin extra.md",
        "extra.html: llms-full.txt does not hold its twin extra.md",
    ]
    (site / "llms.txt").unlink()
    assert "no llms.txt at the site's root" in check_site.check_tool_files(site, ["index.html"])
    assert check_site.check_examples_notes(site, [docs / "tour.md"]) == [
        "tour.html: 1 examples run in CI, but the page does not say so"
    ]
    (site / "tour.html").write_text('<div class="admonition note ci-examples">x</div>')
    assert check_site.check_examples_notes(site, [docs / "tour.md", docs / "index.md"]) == []


def test_site_check_wants_search_that_loads_from_disk(tmp_path: pathlib.Path) -> None:
    (tmp_path / "search").mkdir()
    (tmp_path / "javascripts").mkdir()
    (tmp_path / check_site.WORKER_SHIM).write_text("// shim")
    page = f'<html><script src="{check_site.WORKER_SHIM}"></script></html>'
    (tmp_path / "index.html").write_text(page)
    (tmp_path / "404.html").write_text("<html></html>")
    assert check_site.check_offline_search(tmp_path) == [
        "no search/search_index.js: search cannot load from file:// (is the offline plugin on?)"
    ]
    (tmp_path / "search" / "search_index.js").write_text('var __index = {"docs": []}')
    assert check_site.check_offline_search(tmp_path) == []
    remote = '<script src="https://unpkg.com/iframe-worker/shim"></script></html>'
    (tmp_path / "index.html").write_text(page.replace("</html>", remote))
    (tmp_path / "other.html").write_text("<html></html>")
    assert check_site.check_offline_search(tmp_path) == [
        "index.html loads a script from the network (https://unpkg.com/iframe-worker/shim); a copy opened offline cannot",
        f"other.html does not load {check_site.WORKER_SHIM} (mkdocs.yml extra.polyfills)",
    ]


SEARCH_PAGE = """<html><body><input class="md-search__input"><div class="md-search-result__meta">Type</div><ol></ol>
<script>
document.querySelector("input").addEventListener("keyup", (event) => {
  if (event.target.value === "WANTED") {
    document.querySelector("ol").innerHTML = '<li class="md-search-result__item">hit</li>';
  } else {
    document.querySelector(".md-search-result__meta").textContent = "No matching documents";
  }
});
</script></body></html>"""


def test_browser_search_check_types_and_reads_results(tmp_path: pathlib.Path) -> None:
    browser = check_browser.find_browser()
    if browser is None:
        pytest.skip("no chromium installed (apt-get install -y chromium)")
    (tmp_path / "index.html").write_text(SEARCH_PAGE.replace("WANTED", "checkpoint"))
    (tmp_path / "never.html").write_text(SEARCH_PAGE)
    assert check_browser.check_search(browser, (tmp_path / "index.html").as_uri()) == (1, [])
    with check_browser.serve(tmp_path) as base:
        assert check_browser.check_search(browser, base + "index.html") == (1, [])
        count, problems = check_browser.check_search(browser, base + "never.html", seconds=3)
    assert count == 0 and "typing 'checkpoint' into search listed no result" in problems[0]
    assert "the search panel says 'No matching documents'" in problems[0]
    with tempfile.TemporaryDirectory() as profile:
        with devtools_pipe.Browser([browser, *check_browser.FLAGS, f"--user-data-dir={profile}"]) as tab:
            with pytest.raises(devtools_pipe.DevToolsError, match="No.such"):
                tab.send("No.such")
