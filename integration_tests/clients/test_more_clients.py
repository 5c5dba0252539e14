"""TRL (SFT with accumulation and resume, DPO), a diffusers training loop (bf16, EMA, hooks, checkpoint
limit, TensorBoard, resume) and sentence-transformers, on accel through the opt-in ``accelerate`` alias,
each compared with the figures of the same run on the documented system (reference/CASE.json, recorded by
tools/record_client_reference.py with accelerate 1.15). Skipped unless the clients are installed and the
real ``accelerate`` is not (``nox -s clients`` installs them, pinned)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import sys
from typing import Any

import cases  # integration_tests/clients is on sys.path (rootdir conftest / this folder)
import pytest

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(name) is None for name in ("trl", "diffusers", "sentence_transformers"))
    or importlib.util.find_spec("accelerate") is not None,
    reason="needs trl, diffusers and sentence-transformers without the real accelerate (nox -s clients)",
)


def _compare(ours: Any, reference: Any, tolerance: float, where: str) -> None:
    if isinstance(reference, dict) and "sha256" in reference:
        assert ours["sums"].keys() == reference["sums"].keys(), where
        for name, sums in reference["sums"].items():
            assert ours["sums"][name] == pytest.approx(sums, rel=tolerance, abs=tolerance), f"{where}: {name}"
    elif isinstance(reference, dict):
        assert ours.keys() >= reference.keys(), where
        for key, value in reference.items():
            if key not in ("steps_per_second", "cpu_seconds_per_step"):  # timings: tools/bench/clients.py
                _compare(ours[key], value, tolerance, f"{where}.{key}")
    elif isinstance(reference, float) or (
        isinstance(reference, list) and reference and isinstance(reference[0], float)
    ):
        assert ours == pytest.approx(reference, rel=tolerance, abs=tolerance), where
    else:
        assert ours == reference, where


def _params(case: cases.Case, ours: dict[str, Any]) -> None:
    """A resumed TRL run reaches the parameters of the uninterrupted one (on both systems)."""
    full = next(c for c in cases.CASES if c.name == case.name.removesuffix("-resume"))
    stored = json.loads((cases.REFERENCE / f"{full.name}.json").read_text())["figures"][full.figures[0]]
    resumed = ours[case.figures[0]]["params"]
    assert resumed["sha256"] == stored["params"]["sha256"]


@pytest.mark.timeout(1800)  # a few tiny steps, but each run starts the whole client stack
@pytest.mark.parametrize(
    "case",
    cases.CASES,
    ids=[c.name for c in cases.CASES],
)
def test_client_on_accel_gives_the_documented_systems_figures(case: cases.Case, tmp_path) -> None:
    record = json.loads((cases.REFERENCE / f"{case.name}.json").read_text())
    for name, version in record["versions"].items():
        if name != "accelerate":
            assert importlib.metadata.version(name) == version, f"{name}: figures recorded with {version}"
    ours = cases.run(case, sys.executable, tmp_path, on_accel=True)
    assert ours.keys() == record["figures"].keys()
    for name, reference in record["figures"].items():
        _compare(ours[name], reference, case.tolerance, f"{case.name}:{name}")
    if case.name.startswith("trl-sft") and case.name.endswith("-resume"):
        _params(case, ours)
