"""Add up the JUnit XML reports of one CI run: the slowest tests first (each against the default per-test
limit, so that a test creeping towards it is seen before it fails on a slower machine), then one closing
line: 'N passed, N failed, N skipped'."""

from __future__ import annotations

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


def main() -> int:
    folder = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".nox-reports")
    for seconds, name in slowest(folder):
        print(
            f"slowest: {seconds:7.1f} s ({seconds / DEFAULT_LIMIT_SECONDS:4.0%} of the {DEFAULT_LIMIT_SECONDS:.0f} s limit)  {name}"
        )
    passed, failed, skipped = count(folder)
    print(f"ci: {passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed or passed == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
