"""Shared helpers of the benchmarks: timing, the reference ``accelerate`` interpreter, ratio lines.

Benchmarks are scripts, not tests: each prints ratios of accel against plain PyTorch and against the
reference ``accelerate`` release measured in the same run. The reference runs in its own venv
(``nox -s bench`` builds ``.venv-reference``; ``ACCEL_REFERENCE_PYTHON`` points elsewhere).
"""

from __future__ import annotations

import json
import os
import pathlib
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[2]


def reference_python() -> str | None:
    """Interpreter with the reference ``accelerate`` installed, or None when there is none."""
    candidate = os.environ.get("ACCEL_REFERENCE_PYTHON") or str(ROOT / ".venv-reference" / "bin" / "python")
    return candidate if pathlib.Path(candidate).exists() else None


def median_seconds(fn: Callable[[], Any], repeat: int = 7, warmup: int = 1) -> float:
    """Median wall time of ``fn()`` over ``repeat`` runs after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run_json(python: str, script: str, *args: str, env: dict[str, str] | None = None, timeout: float = 1800) -> Any:
    """Run ``python script args`` and parse the last line of its output as JSON."""
    result = subprocess.run(
        [python, script, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{python} {script} {' '.join(args)} failed:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


#: The section of the output the next ratios belong to (`section()`); it names them in the results file.
_section: list[str] = []


def section(title: str) -> None:
    """Print ``title`` as a section heading and name the following ratios' records after it, so that a script
    measuring several sizes with the same labels keeps each size's records apart in the results file."""
    _section[:] = [title]
    print(f"\n{title}")


def ratio_line(label: str, value: float, baseline: float, unit: str = "s", goal: str = "") -> str:
    """One aligned line: label, value, baseline and their ratio (and the goal, if any)."""
    ratio = value / baseline if baseline else float("inf")
    goal_text = f"   goal {goal}" if goal else ""
    record_result(label, value, baseline, ratio, unit, goal)
    return f"{label:<58} {value:10.4f} {unit} / {baseline:10.4f} {unit} = {ratio:6.3f}{goal_text}"


def record_result(label: str, value: float, baseline: float, ratio: float, unit: str, goal: str) -> None:
    """Append one ratio as a JSON line to the file ``ACCEL_BENCH_RESULTS`` names (the docs plot them)."""
    target = os.environ.get("ACCEL_BENCH_RESULTS")
    if not target:
        return
    record = {
        "script": pathlib.Path(sys.argv[0]).stem,
        "label": f"{_section[0]}: {label}" if _section else label,
        "value": value,
        "baseline": baseline,
        "ratio": ratio if ratio != float("inf") else None,
        "unit": unit,
        "goal": goal,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": machine(),
    }
    with open(target, "a", encoding="utf-8") as file:
        file.write(json.dumps(record) + "\n")


def machine() -> dict[str, Any]:
    """What a figure was measured on: CPU cores and model, GPU (if torch sees one already imported), Python,
    and the installed releases of torch, accel and the reference (read from the package metadata: nothing is
    imported, so the import-time benchmarks are not disturbed)."""
    import platform
    from importlib import metadata

    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), cpu)
    except OSError:
        pass
    torch = sys.modules.get("torch")
    gpu = torch.cuda.get_device_name(0) if torch is not None and torch.cuda.is_available() else None
    return {
        "cores": os.cpu_count(),
        "cpu": cpu,
        "gpu": gpu,
        "python": platform.python_version(),
        "torch": version("torch"),
        "accel": version("accel"),
        "system": platform.platform(terse=True),
    }


def skipped_without(*modules: str, hint: str) -> bool:
    """True, after printing why, when a module this benchmark needs cannot be imported here (``nox -s bench``
    runs every benchmark; one whose library is not installed says so and measures nothing).

    Args:
        modules: The top-level modules the benchmark needs.
        hint: How to get them (an extra, a venv of their own).
    """
    import importlib.util

    lacking = [name for name in modules if importlib.util.find_spec(name) is None]
    if lacking:
        print(f"{pathlib.Path(sys.argv[0]).stem}: skipped, {', '.join(lacking)} not installed here ({hint})")
    return bool(lacking)


def this_python() -> str:
    return sys.executable
