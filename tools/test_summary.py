"""Add up the JUnit XML reports of one CI run and print one closing line: 'N passed, N failed, N skipped'."""

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


def main() -> int:
    folder = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".nox-reports")
    passed, failed, skipped = count(folder)
    print(f"ci: {passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed or passed == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
