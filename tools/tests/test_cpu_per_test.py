"""tools/cpu_per_test.py: a test that runs a CPU-busy child is charged for it; the report sorts by cost."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import cpu_per_test

TOOLS = pathlib.Path(__file__).resolve().parents[1]


def test_a_test_is_charged_for_the_children_it_waited_for(tmp_path: pathlib.Path) -> None:
    (tmp_path / "test_probe.py").write_text(
        "import subprocess, sys\n"
        "def test_busy_child():\n"
        "    subprocess.run([sys.executable, '-c', 'sum(i * i for i in range(3_000_000))'], check=True)\n"
        "def test_idle():\n"
        "    pass\n"
    )
    out = tmp_path / "cpu.jsonl"
    env = {**os.environ, "CPU_PER_TEST_OUT": str(out), "PYTHONPATH": str(TOOLS)}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "cpu_per_test", "-p", "no:cacheprovider", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    records = {json.loads(line)["id"].split("::")[1]: json.loads(line) for line in out.read_text().splitlines()}
    assert set(records) == {"test_busy_child", "test_idle"}
    assert records["test_busy_child"]["children"] > 0.05 > records["test_idle"]["children"]


def test_the_report_puts_the_dearest_first_under_a_total() -> None:
    lines = [
        {"id": "a", "self": 1.0, "children": 0.5},
        {"id": "b", "self": 0.0, "children": 9.0},
        {"id": "c", "self": 0.2, "children": 0.0},
    ]
    report = cpu_per_test.dearest(lines, most=2)
    assert report[0].split() == ["10.7", "total", "of", "3", "tests"]
    assert [row.split()[1] for row in report[1:]] == ["b", "a"]
