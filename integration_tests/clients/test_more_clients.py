"""TRL (SFT with accumulation and resume, DPO), a diffusers training loop (bf16, EMA, hooks, checkpoint
limit, TensorBoard, resume) and sentence-transformers, on accel through the opt-in ``accelerate`` alias,
each compared with the figures of the same run on the documented system (reference/CASE.json, recorded by
tools/record_client_reference.py with accelerate 1.15, on another machine): counts and names exactly,
losses and parameters within the tolerances of compare.py, and a run with one training step changed
must fail that comparison. Skipped unless the clients are installed and the
real ``accelerate`` is not (``nox -s clients`` installs them, pinned)."""

from __future__ import annotations

import dataclasses
import fcntl
import importlib.metadata
import importlib.util
import json
import os
import pathlib
import shutil
import sys
from typing import Any

import cases  # integration_tests/clients is on sys.path (rootdir conftest / this folder)
import compare
import pytest

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(name) is None for name in ("trl", "diffusers", "sentence_transformers"))
    or importlib.util.find_spec("accelerate") is not None,
    reason="needs trl, diffusers and sentence-transformers without the real accelerate (nox -s clients)",
)


def _params(case: cases.Case, ours: dict[str, Any]) -> list[str]:
    """A resumed TRL run reaches the parameters of the uninterrupted one (recorded on the documented system)."""
    full = next(c for c in cases.CASES if c.name == case.name.removesuffix("-resume"))
    stored = json.loads((cases.REFERENCE / f"{full.name}.json").read_text())["figures"][full.figures[0]]
    resumed = ours[case.figures[0]]["params"]
    return compare.differences(resumed, stored["params"], case.tolerance, f"{case.name} resumed vs {full.name}")


def _differences(case: cases.Case, ours: dict[str, Any], record: dict[str, Any]) -> list[str]:
    found = [] if ours.keys() == record["figures"].keys() else [f"figure files {sorted(ours)} vs {sorted(record)}"]
    for name, reference in record["figures"].items():
        if name in ours:
            found += compare.differences(ours[name], reference, case.tolerance, f"{case.name}:{name}")
    if case.name.startswith("trl-sft") and case.name.endswith("-resume"):
        found += _params(case, ours)
    return found


def _record(case: cases.Case) -> dict[str, Any]:
    record = json.loads((cases.REFERENCE / f"{case.name}.json").read_text())
    for name, version in record["versions"].items():
        if name != "accelerate":
            assert importlib.metadata.version(name) == version, f"{name}: figures recorded with {version}"
    return record


# Each client run costs about 12 s of CPU to import its stack, per process. CI runs every client once
# on one process and once on two, and every resume; these repeat a path another case already covers,
# and run before a release (`nox -s slow`).
RELEASE_ONLY = {
    # the -resume cases compare their resumed parameters with this full run's recorded ones
    "trl-sft-1": "trl-sft-1-resume",
    "trl-sft-2": "trl-sft-2-resume",
    "trl-dpo-1": "trl-dpo-2",
    "st-1": "st-2",
    "diffusers-1-resume": "diffusers-2-resume and diffusers-1-ema-update",
    # the ema-update case runs this very case and finds every figure but the EMA's equal to the reference;
    # the EMA's figures (weights and update count) are diffusers-2-resume's, across a resume besides
    "diffusers-1": "diffusers-1-ema-update (every figure but the EMA's) and diffusers-2-resume (the EMA's)",
}


# trl-sft-1-resume resumes from the checkpoint of step 3 that the lr-step run of trl-sft-1 (below) writes before
# its perturbation (after step 4), as a run stopped after step 3 writes it: one start of the client stack (about
# 12 CPU-s) fewer than a stopped run of its own. The lr-step run is made once per test run, whichever
# pytest-xdist worker asks first (the other waits for it on a lock and reads the same files), as conftest's
# `uninterrupted` run: xdist_group does not hold with this pytest (9.x names items by `_id`, which the
# group suffix of pytest-xdist 3.8 does not change).
SHARED_WITH_LR_STEP = "trl-sft-1-resume"


@pytest.fixture(scope="session")
def sft_1_lr_step(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, dict[str, Any]]:
    """trl-sft-1 with one learning-rate step too many after step 4: its folder and its figures."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "trl-sft-1-lr-step"
    with open(f"{folder}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = folder / "figures.json"
        if not done.exists():
            case = next(c for c in cases.CASES if c.name == "trl-sft-1")
            ours = cases.run(case, sys.executable, folder, on_accel=True, env={"CLIENT_PERTURB": "lr-step"})
            done.write_text(json.dumps(ours))
    return folder, json.loads(done.read_text())


def _case_param(case: cases.Case) -> Any:
    covered_by = RELEASE_ONLY.get(case.name)
    marks = [pytest.mark.release(covered_by=covered_by)] if covered_by else []
    return pytest.param(case, marks=marks, id=case.name)


@pytest.mark.timeout(1800)  # a few tiny steps, but each run starts the whole client stack
@pytest.mark.parametrize("case", [_case_param(case) for case in cases.CASES])
def test_client_on_accel_gives_the_documented_systems_figures(
    case: cases.Case, tmp_path: pathlib.Path, request: pytest.FixtureRequest
) -> None:
    record = _record(case)
    if case.name == SHARED_WITH_LR_STEP:
        # the stopped run's only product is checkpoint-3 (sft-stop writes no figures): taken from the lr-step run
        assert case.runs == (("cut", "sft-stop"), ("cut", "sft-resume")), case.runs
        lr_step_folder, _ = request.getfixturevalue("sft_1_lr_step")
        shutil.copytree(lr_step_folder / "full" / "checkpoint-3", tmp_path / "cut" / "checkpoint-3")
        case = dataclasses.replace(case, runs=case.runs[1:])
    ours = cases.run(case, sys.executable, tmp_path, on_accel=True)
    found = _differences(case, ours, record)
    assert not found, "\n".join(found)
    print(case.name, "largest deviations:", compare.spread(ours, record["figures"], case.tolerance))


# One changed training step must fail the comparison that the machine's own rounding passes: the
# tolerances are far above reordering noise but far below any change of what is trained.
PERTURBED = [
    ("trl-sft-1", "lr-step", ".params: all tensors"),  # one learning-rate step too many: later updates are off
    ("diffusers-1", "ema-update", ".ema_updates"),  # one EMA update dropped (below bf16 noise in the weights)
    ("diffusers-1", "skip-batch", ".losses"),  # one batch not trained on
]


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("name,perturbation,caught_in", PERTURBED, ids=[f"{n}-{p}" for n, p, _ in PERTURBED])
def test_a_changed_training_step_fails_the_comparison(
    name: str, perturbation: str, caught_in: str, tmp_path: pathlib.Path, request: pytest.FixtureRequest
) -> None:
    case = next(c for c in cases.CASES if c.name == name)
    record = _record(case)
    if (name, perturbation) == ("trl-sft-1", "lr-step"):
        _, ours = request.getfixturevalue("sft_1_lr_step")  # its checkpoint-3 serves trl-sft-1-resume
    else:
        ours = cases.run(case, sys.executable, tmp_path, on_accel=True, env={"CLIENT_PERTURB": perturbation})
    print(name, perturbation, "largest deviations:", compare.spread(ours, record["figures"], case.tolerance))
    found = _differences(case, ours, record)
    assert any(caught_in in line for line in found), "\n".join(found) or "no difference found"
    if perturbation == "ema-update":  # the model itself trained as recorded: only the EMA is off
        assert not [line for line in found if ".params" in line or ".losses" in line], "\n".join(found)
        # and so did the rest of the run (steps, checkpoints, event files, world): the unperturbed case,
        # diffusers-1, runs before a release only
        assert all(".ema" in line for line in found), "\n".join(found)
    if perturbation == "skip-batch":
        assert any(".params: all tensors" in line for line in found), "\n".join(found)
