"""`accel verify` from parsed arguments to an exit status: plan, two runs, comparison, report.

Exit status: 0 when every recorded quantity agrees within tolerance, 1 when something differs, 2 when
the input is wrong or a run could not start or did not record its steps (one line says which).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field

from accel_launch.verify.runs import REFERENCES, RunResult, VerifyError

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from typing import Any

    from accel_launch.verify.compare import Comparison

AGREE, DIFFER, FAILED = 0, 1, 2


@dataclass
class VerifyResult:
    """The outcome of `accel verify`.

    Args:
        exit_code: 0 agree, 1 differ, 2 bad input or a run that could not start or finish.
        report: the text printed (the table and the divergences, or the error line).
        comparison: the step-by-step comparison (``None`` when a run failed).
        error: the error line when ``exit_code`` is 2.
        records: what each run recorded (``run``, ``reference`` and, with ``--resume-at``, ``resumed``).
        resume: with ``--resume-at``, the resumed run against the uninterrupted one.
    """

    exit_code: int
    report: str
    comparison: Comparison | None = None
    error: str | None = None
    records: dict[str, Any] = field(default_factory=dict)
    resume: Comparison | None = None

    @property
    def agree(self) -> bool:
        """True when the runs agree within tolerance."""
        return self.exit_code == AGREE


def verify_from_args(args: argparse.Namespace) -> VerifyResult:
    """Run `accel verify` with arguments parsed by `accel_launch.commands.verify.verify_parser()`."""
    try:
        _check_input(args)
    except VerifyError as error:
        return VerifyResult(FAILED, f"accel verify: error: {error}", error=str(error))
    folder = tempfile.mkdtemp(prefix="accel-verify-")
    try:
        result = _verify(args, folder)
    except VerifyError as error:  # the folder stays: the error names the run's log in it
        return VerifyResult(FAILED, f"accel verify: error: {error}", error=str(error))
    shutil.rmtree(folder, ignore_errors=True)
    return result


def _check_input(args: argparse.Namespace) -> None:
    """Refuse bad ``accel verify`` options before anything runs (`VerifyError` naming the option)."""
    from accel_launch.verify.compare import tolerance_for

    steps, reference = args.steps, args.reference
    if steps is None or steps < 1:
        raise VerifyError(f"--steps must be a whole number of optimizer steps >= 1, got {steps}")
    if reference not in REFERENCES:
        raise VerifyError(f"unknown reference {reference!r}: choose one of {', '.join(REFERENCES)}")
    if getattr(args, "dry_run", False):
        raise VerifyError("--dry_run does not run the script; run `accel launch --dry_run` to see the plan")
    try:
        tolerance_for("no", args.rtol, args.atol)
    except ValueError as error:
        raise VerifyError(str(error)) from None
    from accel_launch.verify.resume import check_resume_options

    check_resume_options(getattr(args, "resume_at", None), steps, getattr(args, "resume_args", None))


def _verify(args: argparse.Namespace, folder: str) -> VerifyResult:
    from accel_launch.launch_args import given_flags
    from accel_launch.verify.compare import looser_precision, tolerance_for
    from accel_launch.verify.runs import flags_to_argv, reference_argv, reference_env, run_once

    steps, reference = args.steps, args.reference
    flags = given_flags(args)
    plan = _plan(args)
    config_path = os.path.join(folder, "reference_config.json")
    with open(config_path, "w", encoding="utf-8") as handle:
        json.dump({"compute_environment": "LOCAL_MACHINE"}, handle)
    script = [args.training_script, *args.training_script_args]
    resume_at, resume_args = getattr(args, "resume_at", None), getattr(args, "resume_args", None)
    resume_dir = os.path.join(folder, "resume")
    run_env = dict(os.environ)
    if resume_at is not None:
        from accel_launch.verify.resume import requested_env

        run_env.update(requested_env(resume_at, resume_dir))
    run = run_once("requested", flags_to_argv(flags), script, steps, folder, run_env)
    # the reference reads the batches the requested run read: as many readers as it had data-parallel ranks
    data_parallel = int(run.record.get("data_parallel_size") or plan.num_processes)
    ref_argv = reference_argv(plan, reference, flags, config_path, data_parallel)
    ref_env = reference_env(os.environ, plan, reference, data_parallel)
    ref = run_once("reference", ref_argv, script, steps, folder, ref_env)
    precision = looser_precision(run.record.get("mixed_precision"), ref.record.get("mixed_precision"))
    tolerance = tolerance_for(precision, args.rtol, args.atol)
    comparison = _compare(run, ref, tolerance, steps)
    records = {"run": run.record, "reference": ref.record}
    resume = None
    if resume_at is not None:
        resumed, resume_comparison = _resume(run, script, steps, folder, resume_dir, resume_at, resume_args, tolerance)
        records["resumed"] = resumed.record
        how = "the script's own resume, given " + repr(resume_args) if resume_args is not None else "the recorder"
        resume = (resume_comparison, f"saved after step {resume_at}, loaded by {how}, steps {resume_at + 1}-{steps}")
    from accel_launch.verify.report import format_report

    run_label = (
        "accel launch " + " ".join(run.launch_argv) if run.launch_argv else "accel launch (config file defaults)"
    )
    ref_label = f"{reference} on {1 if reference == 'single' else data_parallel} process(es)"
    if data_parallel != plan.num_processes:
        ref_label += ", one per data-parallel rank of the run"
    text = format_report(comparison, run_label, ref_label, resume)
    agree = comparison.agree and (resume is None or resume[0].agree)
    if args.json_path:
        saved = {**comparison.to_dict(), "steps_requested": steps, "reference": reference, "records": records}
        if resume is not None:
            saved["resume"] = {"at": resume_at, "resume_args": resume_args, **resume[0].to_dict()}
            saved["result"] = "agree" if agree else "differ"
        with open(args.json_path, "w", encoding="utf-8") as handle:
            json.dump(saved, handle, indent=1)
    return VerifyResult(AGREE if agree else DIFFER, text, comparison, records=records, resume=resume and resume[0])


def _resume(
    run: RunResult,
    script: list[str],
    steps: int,
    folder: str,
    resume_dir: str,
    resume_at: int,
    resume_args: str | None,
    tolerance: Any,
) -> tuple[RunResult, Comparison]:
    """Launch the requested configuration again, resuming after step ``resume_at``; compare it with ``run``."""
    import torch

    from accel_launch.verify.resume import compare_resumed, resume_launch_args
    from accel_launch.verify.runs import run_once

    env, extra = resume_launch_args(resume_dir, resume_args)
    resumed = run_once("resumed", run.launch_argv, [*script, *extra], steps, folder, {**os.environ, **env})
    comparison = compare_resumed(
        run.record,
        resumed.record,
        torch.load(run.params_path, weights_only=True),
        torch.load(resumed.params_path, weights_only=True),
        tolerance,
        resume_at,
        steps,
    )
    return resumed, comparison


def _plan(args: argparse.Namespace) -> Any:
    from accel_launch.commands.launch import plan_launch
    from accel_launch.runner import LaunchError
    from accel_launch.values import ConfigError

    try:
        return plan_launch(args)
    except (ConfigError, LaunchError, FileNotFoundError) as error:
        raise VerifyError(str(error)) from None


def _compare(run: RunResult, ref: RunResult, tolerance: Any, steps: int) -> Comparison:
    import torch

    from accel_launch.verify.compare import compare_parameters, compare_steps

    comparison = compare_steps(run.record, ref.record, tolerance)
    run_params = torch.load(run.params_path, weights_only=True)
    ref_params = torch.load(ref.params_path, weights_only=True)
    compare_parameters(run_params, ref_params, tolerance, steps, comparison)
    return comparison


def print_result(result: VerifyResult) -> int:
    """Print ``result``'s report (stdout; the error line on stderr) and return its exit status."""
    stream = sys.stderr if result.exit_code == FAILED else sys.stdout
    print(result.report, file=stream)
    return result.exit_code
