"""A pytest plugin that records the CPU time each test costs: its own process's and that of the processes it
started and waited for (``accel launch`` and its ranks, client runs), one JSON line per test.

CI is CPU-bound on its 2 cores, so CPU seconds, not wall time, say which tests are dear; wall time under
load mostly says what else was running. Processes a test leaves running (a pool kept for the session, Ray's
daemons) are not counted: their time is not known until they are waited for.

Usage (from the repository root)::

    CPU_PER_TEST_OUT=/tmp/cpu.jsonl PYTHONPATH=tools:$PYTHONPATH python -m pytest -p cpu_per_test integration_tests
    python tools/cpu_per_test.py /tmp/cpu.jsonl          # the dearest tests first

With pytest-xdist every worker appends to the same file (one short line per write).
"""

from __future__ import annotations

import json
import os
import resource
import sys
from collections.abc import Iterator
from typing import Any

import pytest

#: The variable naming the file the lines are appended to; without it the plugin records nothing.
OUT_VAR = "CPU_PER_TEST_OUT"


def _cpu_seconds() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    waited = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, waited.ru_utime + waited.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Append ``{"id", "self", "children"}`` (CPU seconds) for ``item`` to the file named by `OUT_VAR`."""
    out = os.environ.get(OUT_VAR)
    before = _cpu_seconds()
    yield
    if not out:
        return
    after = _cpu_seconds()
    line = {"id": item.nodeid, "self": round(after[0] - before[0], 2), "children": round(after[1] - before[1], 2)}
    with open(out, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(line) + "\n")


def dearest(lines: list[dict[str, Any]], most: int = 40) -> list[str]:
    """The ``most`` dearest tests of ``lines`` (records of this plugin), as ``CPU-s  test id`` rows, and a
    total row first."""
    rows = sorted(lines, key=lambda r: -(r["self"] + r["children"]))
    total = sum(r["self"] + r["children"] for r in rows)
    report = [f"{total:8.1f}  total of {len(rows)} tests"]
    report += [f"{r['self'] + r['children']:8.1f}  {r['id']}" for r in rows[:most]]
    return report


def main(argv: list[str]) -> int:
    """Print the dearest tests of the files named in ``argv``."""
    if not argv:
        print("usage: python tools/cpu_per_test.py RECORD.jsonl [...]", file=sys.stderr)
        return 2
    lines = []
    for path in argv:
        with open(path, encoding="utf-8") as handle:
            lines += [json.loads(line) for line in handle if line.strip()]
    print("\n".join(dearest(lines)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
