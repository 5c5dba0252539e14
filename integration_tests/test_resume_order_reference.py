"""A script written for the documented system reads, after ``load_state``, what it reads there.

``resume_order_job.py`` saves mid-epoch, then a second run loads the state and skips the seen batches
with ``skip_first_batches``, as the documented checkpointing guide shows. On one process (plain
``python``) and on two (the real ``accel launch``), every batch and every random draw of both runs
equals the figures recorded on Hugging Face Accelerate 1.15 (``reference/resume_order.json``, from
``tools/record_resume_order_reference.py``): the loader is left as prepared, so the resumed epoch's
order, and the random numbers after it, are the documented system's. With accel's opt-in
``replay_epoch_on_resume=True`` the resumed run instead continues the uninterrupted one exactly, and
so does it with the documented ``use_stateful_dataloader=True`` (where Accelerate 1.15's resumed order
parts from its uninterrupted run: recorded, not copied).

The two-process cases share their launches: one ``save`` launch runs every case's save, one after another in
the same processes (each from ``set_seed(0)`` with an ``Accelerator`` and a loader of its own, in a folder of
its own), and one ``resume`` launch every resume; each test then checks its own case's logs.
"""

from __future__ import annotations

import json
import pathlib
import sys
from collections.abc import Callable

import pytest
from conftest import ROOT, accel_command, run_command
from resume_order_job import PHASES, REFERENCE_CASES, REPLAY_CASES, STATEFUL_CASES, read_logs

JOB = str(ROOT / "integration_tests" / "resume_order_job.py")
REFERENCE = json.loads((ROOT / "integration_tests" / "reference" / "resume_order.json").read_text())


def run_case(folder: pathlib.Path, processes: int, epoch: int, step: int, options: tuple[str, ...]) -> dict:
    """Both phases of a case on accel: {phase: {rank: log}}."""
    return run_cases({"case": (processes, epoch, step, options)}, folder)["case"]


def run_cases(cases: dict[str, tuple[int, int, int, tuple[str, ...]]], folder: pathlib.Path) -> dict[str, dict]:
    """Both phases of cases of one process count on accel, one launch per phase for all of them (each case
    from ``set_seed(0)`` with an Accelerator and a loader of its own, in ``folder/NAME``): {name: {phase: {rank: log}}}."""
    (processes,) = {case[0] for case in cases.values()}
    launch = (
        [sys.executable, JOB]
        if processes == 1
        else [*accel_command(), "launch", "--cpu", "--num_processes", str(processes), JOB]
    )
    args: list[str] = []
    for name, (_, epoch, step, options) in cases.items():
        (folder / name).mkdir(parents=True)
        args += [*(["--"] if args else []), str(folder / name), str(epoch), str(step), *options]
    for phase in PHASES:
        done = run_command([*launch, phase, *args], timeout=300)
        assert done.returncode == 0, (phase, (done.stdout + done.stderr)[-4000:])
    return {name: read_logs(str(folder / name), processes) for name in cases}


#: Every two-process case of this file: two launches (save, resume) for all of them, not two per case. Each
#: launch starts three interpreters that import torch (the launcher and two workers): most of a case's time.
#: The opt-ins first: the replay case's save and resume are the first of their processes, as alone; a resumed
#: run that leaned on something an earlier case left in the process would differ from the figures it is
#: compared with (recorded, or its own uninterrupted run), not match them.
TWO_PROCESS_CASES = {
    name: case for name, case in {**REPLAY_CASES, **STATEFUL_CASES, **REFERENCE_CASES}.items() if case[0] == 2
}


@pytest.fixture(scope="module")
def two_process_figures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    return run_cases(TWO_PROCESS_CASES, tmp_path_factory.mktemp("two-processes"))


FiguresOf = Callable[[str, dict], dict]


@pytest.fixture
def figures_of(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> FiguresOf:
    """``figures_of(name, cases)``: the case's figures (a two-process case's from the shared launches)."""

    def get(name: str, cases: dict) -> dict:
        processes, epoch, step, options = cases[name]
        if processes == 2:
            return request.getfixturevalue("two_process_figures")[name]
        return run_case(tmp_path, processes, epoch, step, options)

    return get


def _reference_cases() -> list:
    """The recorded cases; the one-process seedable one runs before a release (`nox -s slow`): the two-process
    seedable case runs the same save and resume (same epoch and step) with a sharded loader besides, and the
    one-process default case keeps the unsharded loader's resume in CI."""
    return [
        pytest.param(name, marks=pytest.mark.release(covered_by="the two-process seedable case"))
        if name == "one-process-seedable-epoch-1"
        else name
        for name in sorted(REFERENCE_CASES)
    ]


@pytest.mark.parametrize("name", _reference_cases())
def test_the_resumed_run_reads_what_the_documented_system_reads(figures_of: FiguresOf, name: str) -> None:
    figures = figures_of(name, REFERENCE_CASES)
    expected = REFERENCE["cases"][name]
    for phase in PHASES:
        for rank, log in expected[phase].items():
            assert figures[phase][rank] == log, (phase, rank)


def _continues(figures: dict, processes: int, epoch: int, step: int) -> None:
    """Each process's resumed run reads exactly what its uninterrupted run read from the saved step on."""
    for rank in range(processes):
        uninterrupted = figures["save"][str(rank)]
        resumed_from = next(i for i, (e, s, _, _) in enumerate(uninterrupted) if (e, s) == (epoch, step))
        assert figures["resume"][str(rank)] == uninterrupted[resumed_from:], rank


def _opt_in_cases(cases: dict) -> list:
    """The opt-in cases; the one-process ones run before a release (`nox -s slow`): the two-process case
    of the same opt-in runs the same resume with a sharded loader besides."""
    return [
        pytest.param(name, marks=pytest.mark.release(covered_by=f"the two-process {name.split('-')[-3]} case"))
        if name.startswith("one-process-")
        else name
        for name in sorted(cases)
    ]


@pytest.mark.parametrize("name", _opt_in_cases(REPLAY_CASES))
def test_the_replay_opt_in_continues_the_uninterrupted_run(figures_of: FiguresOf, name: str) -> None:
    processes, epoch, step, _ = REPLAY_CASES[name]
    _continues(figures_of(name, REPLAY_CASES), processes, epoch, step)


@pytest.mark.parametrize("name", _opt_in_cases(STATEFUL_CASES))
def test_the_stateful_opt_in_continues_the_uninterrupted_run(figures_of: FiguresOf, name: str) -> None:
    processes, epoch, step, _ = STATEFUL_CASES[name]
    figures = figures_of(name, STATEFUL_CASES)
    _continues(figures, processes, epoch, step)
    if processes > 1:  # sharded, the loader owns its generator in both systems: the same uninterrupted run
        assert figures["save"] == REFERENCE["cases"][name]["save"]
