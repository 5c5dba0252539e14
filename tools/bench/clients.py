"""Steps/s of the client cases (TRL, diffusers) on accel against the same run on accelerate 1.15.

    .venv/bin/python tools/bench/clients.py                         # trl-dpo-1 and diffusers-1, 3 rounds
    .venv/bin/python tools/bench/clients.py --cases trl-dpo-2 --rounds 5 --steps 32
    .venv/bin/python tools/bench/clients.py --profile /tmp/prof      # cProfile of one run each (1 process)

Each round runs the case on the reference interpreter and on accel one after the other (the order
alternates between rounds), with more optimizer steps than the test (``CLIENT_MAX_STEPS``), and takes
the case's own figures: steps/s of training (wall) and CPU seconds per step of the main process. It
prints the medians and their ratios, accel over the reference (>= 1.0 is the goal for both): the CPU
ratio is the one to trust on a machine that other work loads. The reference interpreter is the venv
that tools/record_client_reference.py builds (``--reference``, or ``ACCEL_REFERENCE_PYTHON``).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "integration_tests" / "clients"))

import cases  # noqa: E402
from _common import ratio_line, skipped_without  # noqa: E402

DEFAULT_REFERENCE = pathlib.Path(tempfile.gettempdir()) / "accel-client-reference" / "bin" / "python"


def _timings(figures: dict) -> tuple[float, float]:
    """(steps/s, CPU seconds per step) of the run that wrote ``figures`` (its one figures file)."""
    (only,) = figures.values()
    return float(only["steps_per_second"]), float(only["cpu_seconds_per_step"])


def _run(case: cases.Case, python: str, on_accel: bool, steps: int, work: pathlib.Path) -> tuple[float, float]:
    os.environ["CLIENT_MAX_STEPS"] = str(steps)
    return _timings(cases.run(case, python, work, on_accel=on_accel, timeout=1800))


def _profile(case: cases.Case, python: str, on_accel: bool, steps: int, out: pathlib.Path) -> None:
    """One run of a one-process case under cProfile, written to ``out`` (``python -m pstats out``)."""
    if case.processes != 1:
        raise SystemExit(f"--profile runs one-process cases only; {case.name} has {case.processes}")
    folder, mode = case.runs[-1]
    with tempfile.TemporaryDirectory() as work:
        done = subprocess.run(
            [python, "-m", "cProfile", "-o", str(out), str(cases.HERE / case.script), folder, mode],
            cwd=work,
            env={**cases.environment(on_accel), "CLIENT_MAX_STEPS": str(steps)},
            capture_output=True,
            text=True,
            check=False,
        )
    if done.returncode != 0:
        raise RuntimeError(f"profiling {case.name} failed:\n{(done.stdout + done.stderr)[-4000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="*", default=["trl-dpo-1", "diffusers-1"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=24, help="optimizer steps of each run (CLIENT_MAX_STEPS)")
    parser.add_argument("--reference", default=os.environ.get("ACCEL_REFERENCE_PYTHON", str(DEFAULT_REFERENCE)))
    parser.add_argument("--accel", default=sys.executable, help="accel's interpreter (default: this one)")
    parser.add_argument("--profile", type=pathlib.Path, help="write CASE-SYSTEM.prof here instead of timing")
    options = parser.parse_args()
    if options.accel == sys.executable and skipped_without(
        "trl", "diffusers", hint="run it with the interpreter of the clients session's venv, see this docstring"
    ):
        return
    if not pathlib.Path(options.reference).exists():
        raise SystemExit(f"no reference interpreter at {options.reference}: run tools/record_client_reference.py")
    chosen = [case for case in cases.CASES if case.name in options.cases]
    unknown = set(options.cases) - {case.name for case in chosen}
    if unknown:
        raise SystemExit(f"unknown cases {sorted(unknown)}; known: {[case.name for case in cases.CASES]}")
    for case in chosen:
        if any("stop" in mode for _, mode in case.runs):
            raise SystemExit(f"{case.name} stops and resumes: time a case of one run")
        if options.profile:
            options.profile.mkdir(parents=True, exist_ok=True)
            for system, python, on_accel in (("reference", options.reference, False), ("accel", options.accel, True)):
                _profile(case, python, on_accel, options.steps, options.profile / f"{case.name}-{system}.prof")
            print(f"{case.name}: profiles in {options.profile}", flush=True)
            continue
        runs: dict[str, list[tuple[float, float]]] = {"reference": [], "accel": []}
        for round_ in range(options.rounds):
            order = [("reference", options.reference, False), ("accel", options.accel, True)]
            for system, python, on_accel in order if round_ % 2 == 0 else order[::-1]:
                with tempfile.TemporaryDirectory() as work:
                    runs[system].append(_run(case, python, on_accel, options.steps, pathlib.Path(work) / system))
        ours = [statistics.median(values) for values in zip(*runs["accel"])]
        theirs = [statistics.median(values) for values in zip(*runs["reference"])]
        label = f"{case.name} ({options.steps} steps, {options.rounds} rounds)"
        print(ratio_line(f"{label} steps/s, wall", ours[0], theirs[0], "/s", ">= 1.0"), flush=True)
        # CPU: the reference's seconds per step over accel's, so that >= 1.0 is faster here too
        print(ratio_line(f"{label} steps per CPU-s", 1 / ours[1], 1 / theirs[1], "/s", ">= 1.0"), flush=True)


if __name__ == "__main__":
    main()
