"""The repository tools: version bump, affected packages, dependency check, CI summary (on a copy)."""

from __future__ import annotations

import datetime
import pathlib
import shutil
import subprocess
import sys

import pytest

TOOLS = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TOOLS))

import affected as affected_tool  # noqa: E402
import bump_version  # noqa: E402
import check_deps  # noqa: E402
import repo  # noqa: E402
import test_summary  # noqa: E402


@pytest.fixture
def repo_copy(tmp_path: pathlib.Path) -> pathlib.Path:
    """The packages' metadata copied to a scratch folder (no source beyond __about__)."""
    for pyproject in (repo.ROOT / "packages").glob("*/pyproject.toml"):
        target = tmp_path / "packages" / pyproject.parent.name
        target.mkdir(parents=True)
        shutil.copy(pyproject, target / "pyproject.toml")
        shutil.copy(pyproject.parent / "CHANGELOG.md", target / "CHANGELOG.md")
        for about in (pyproject.parent / "src").glob("*/__about__.py"):
            (target / "src" / about.parent.name).mkdir(parents=True)
            shutil.copy(about, target / "src" / about.parent.name / "__about__.py")
    return tmp_path


def test_next_version_and_ranges() -> None:
    assert bump_version.next_version("0.1.0", "minor") == "0.2.0"
    assert bump_version.next_version("0.1.0", "patch") == "0.1.1"
    assert bump_version.next_version("0.1.0", "major") == "1.0.0"
    assert bump_version.next_version("0.1.0", "2.3.4") == "2.3.4"
    assert bump_version.compatible_range("0.2.0") == ">=0.2,<0.3"
    assert bump_version.compatible_range("1.4.0") == ">=1.4,<2"
    with pytest.raises(ValueError, match="major, minor, patch"):
        bump_version.next_version("0.1.0", "huge")


def test_bump_updates_version_dependents_meta_pin_and_changelog(repo_copy: pathlib.Path) -> None:
    new = bump_version.bump("accel-state", "minor", root=repo_copy, today=datetime.date(2026, 1, 2))
    assert new == "0.2.0"
    dists = repo.distributions(repo_copy)
    assert dists["accel-state"].version == "0.2.0"
    assert '"accel-state>=0.2,<0.3"' in (repo_copy / "packages/accel-data/pyproject.toml").read_text()
    assert '"accel-state==0.2.0"' in (repo_copy / "packages/accel/pyproject.toml").read_text()
    changelog = (repo_copy / "packages/accel-state/CHANGELOG.md").read_text()
    assert "## Unreleased\n\n## 0.2.0 (2026-01-02)" in changelog


def test_affected_includes_dependents_and_everything_for_tooling() -> None:
    dists = repo.distributions()
    assert affected_tool.affected(["packages/accel-bigmodel/src/accel_bigmodel/x.py"], dists) == [
        "accel",
        "accel-bigmodel",
        "accel-quant",
        "accel-train",
    ]
    assert affected_tool.affected(["packages/accel-train/README.md"], dists) == ["accel", "accel-train"]
    assert affected_tool.affected(["docs/index.md"], dists) == []
    assert affected_tool.affected(["noxfile.py"], dists) == sorted(dists)


def test_check_deps_passes_on_the_repository() -> None:
    assert check_deps.check() == []


def test_check_deps_flags_a_forbidden_import(tmp_path: pathlib.Path) -> None:
    scanner = check_deps.ImportScanner()
    import ast

    scanner.visit(ast.parse("import wandb\n\ndef f():\n    import tensorboard\nif TYPE_CHECKING:\n    import mlflow\n"))
    assert scanner.found == [("wandb", 1, True), ("tensorboard", 4, False), ("mlflow", 6, False)]


def test_summary_counts_junit_reports(tmp_path: pathlib.Path) -> None:
    (tmp_path / "a.xml").write_text(
        '<testsuites><testsuite tests="5" failures="1" errors="0" skipped="2"/></testsuites>'
    )
    (tmp_path / "b.xml").write_text('<testsuite tests="3" failures="0" errors="1" skipped="0"/>')
    assert test_summary.count(tmp_path) == (4, 2, 2)


def test_summary_adds_up_the_cpu_records_per_run_and_names_the_dearest_tests(tmp_path: pathlib.Path) -> None:
    (tmp_path / "cpu-integration.jsonl").write_text(
        '{"id": "t.py::a", "self": 1.0, "children": 30.5}\n{"id": "t.py::b", "self": 2.0, "children": 0.0}\n'
    )
    (tmp_path / "cpu-tests-accel.jsonl").write_text('{"id": "u.py::c", "self": 10.0, "children": 0.0}\n\n')
    runs, dearest = test_summary.cpu_seconds(tmp_path, how_many=2)
    assert runs == [(33.5, "integration (2 tests)"), (10.0, "tests-accel (1 tests)")]
    assert dearest == [(31.5, "integration: t.py::a"), (10.0, "tests-accel: u.py::c")]


def test_the_bench_session_runs_no_helper_script() -> None:
    """``nox -s bench`` runs every tools/bench script whose name does not start with ``_``; a script that
    another one starts as its worker (named there as ``"X.py"``) must be one it skips."""
    import re

    bench = TOOLS / "bench"
    scripts = {path.name for path in bench.glob("*.py")}
    started = set()
    for path in bench.glob("*.py"):  # paths built from this folder: `dirname(__file__)` or `... / "bench" / "X.py"`
        found = re.findall(r'(?:__file__|"bench")[^\n]*"([A-Za-z_0-9]+\.py)"', path.read_text())
        started |= {name for name in found if name in scripts}
    assert started, "no bench script starts another: the check would be empty"
    assert sorted(name for name in started if not name.startswith("_")) == []


def test_affected_cli_runs() -> None:
    out = subprocess.run(
        [sys.executable, str(TOOLS / "affected.py"), "--files", "packages/accel-launch/x"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.split() == ["accel", "accel-launch"]
