"""Add up the reports of one CI run: the CPU seconds of each pytest run and the dearest tests (from the
``cpu-*.jsonl`` records of tools/cpu_per_test.py: CI is CPU-bound, so these say where its minutes go), the
slowest tests (each against the default per-test limit, so that a test creeping towards it is seen before
it fails on a slower machine), then one closing line from the JUnit XML reports: 'N passed, N failed,
N skipped'."""

from __future__ import annotations

import json
import pathlib
import sys
import xml.etree.ElementTree as ET


def count(folder: pathlib.Path) -> tuple[int, int, int]:
    passed = failed = skipped = 0
    for report in sorted(folder.glob("*.xml")):
        root = ET.parse(report).getroot()
        suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
        for suite in suites:
            total = int(suite.get("tests", 0))
            bad = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
            skip = int(suite.get("skipped", 0))
            passed += total - bad - skip
            failed += bad
            skipped += skip
    return passed, failed, skipped


#: pytest-timeout's limit for one test (pyproject.toml), which the slowest tests are measured against.
DEFAULT_LIMIT_SECONDS = 600.0


def slowest(folder: pathlib.Path, how_many: int = 10) -> list[tuple[float, str]]:
    """The ``how_many`` slowest test cases of the reports: ``(seconds, "report: class::name")``."""
    found = []
    for report in sorted(folder.glob("*.xml")):
        for case in ET.parse(report).getroot().iter("testcase"):
            name = f"{report.stem}: {case.get('classname', '')}::{case.get('name', '')}"
            found.append((float(case.get("time", 0) or 0), name))
    return sorted(found, reverse=True)[:how_many]


def cpu_seconds(folder: pathlib.Path, how_many: int = 15) -> tuple[list[tuple[float, str]], list[tuple[float, str]]]:
    """From the ``cpu-REPORT.jsonl`` records: ``(per pytest run, dearest tests)``, each a list of
    ``(CPU seconds, name)``, dearest first; the tests' list holds ``how_many``. A test's seconds are its
    pytest process's and those of the processes it started and waited for."""
    runs, tests = [], []
    for record in sorted(folder.glob("cpu-*.jsonl")):
        report = record.stem.removeprefix("cpu-")
        lines = [json.loads(line) for line in record.read_text(encoding="utf-8").splitlines() if line.strip()]
        costs = [(line["self"] + line["children"], f"{report}: {line['id']}") for line in lines]
        runs.append((sum(cost for cost, _ in costs), f"{report} ({len(costs)} tests)"))
        tests += costs
    return sorted(runs, reverse=True), sorted(tests, reverse=True)[:how_many]


def main() -> int:
    folder = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".nox-reports")
    runs, dearest = cpu_seconds(folder)
    if runs:
        print(
            f"cpu: {sum(cost for cost, _ in runs):.0f} CPU-s in the tests of {len(runs)} pytest runs (a process a "
            "test leaves running, such as a session's pool of ranks, is not counted)"
        )
    for cost, name in runs:
        print(f"cpu: {cost:8.1f} CPU-s  {name}")
    for cost, name in dearest:
        print(f"dearest: {cost:7.1f} CPU-s  {name}")
    for seconds, name in slowest(folder):
        print(
            f"slowest: {seconds:7.1f} s ({seconds / DEFAULT_LIMIT_SECONDS:4.0%} of the {DEFAULT_LIMIT_SECONDS:.0f} s limit)  {name}"
        )
    passed, failed, skipped = count(folder)
    print(f"ci: {passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed or passed == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
