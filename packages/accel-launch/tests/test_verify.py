"""`accel verify`'s own logic, without starting a run: tolerances, the comparison and its first
divergences, the report, the reference launch, and bad input (exit status 2, one line)."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from accel_launch.commands.launch import plan_launch
from accel_launch.commands.verify import main, verify_parser
from accel_launch.launch_args import given_flags, launch_command_parser
from accel_launch.verify import verify
from accel_launch.verify.compare import (
    UNPREPARED_OPTIMIZER_NOTE,
    Tolerance,
    compare_parameters,
    compare_steps,
    tolerance_for,
)
from accel_launch.verify.report import format_report
from accel_launch.verify.runs import VerifyError, flags_to_argv, reference_argv, reference_env

TIGHT = Tolerance(1e-4, 1e-6, "test")


def _record(losses: list[float], norms: list[float | None] | None = None, lrs: list[float] | None = None) -> dict:
    norms = norms or [1.0] * len(losses)
    lrs = lrs or [0.01] * len(losses)
    return {
        "steps": [
            {"step": i + 1, "loss": loss, "grad_norm": norm, "lr": lr}
            for i, (loss, norm, lr) in enumerate(zip(losses, norms, lrs))
        ]
    }


# -- tolerances -------------------------------------------------------------------------------------------


def test_tolerances_follow_the_precision_and_say_where_they_come_from() -> None:
    fp32, bf16 = tolerance_for("no"), tolerance_for("bf16")
    assert (fp32.rtol, fp32.atol) == (1e-4, 1e-6) and fp32.source == "float32 default"
    assert bf16.rtol > fp32.rtol and bf16.atol > fp32.atol and bf16.source == "bf16 default"
    given = tolerance_for("bf16", rtol=0.5)
    assert (given.rtol, given.atol) == (0.5, bf16.atol)
    assert "--rtol given, else bf16 default" in given.describe()


def test_an_unknown_precision_or_a_negative_tolerance_is_named() -> None:
    with pytest.raises(ValueError, match="mixed precision 'fp4'.*expected one of no, fp16, bf16, fp8"):
        tolerance_for("fp4")
    with pytest.raises(ValueError, match="--atol must be a finite number >= 0, got -1"):
        tolerance_for("no", atol=-1.0)


def test_the_tolerance_is_relative_to_the_reference() -> None:
    tolerance = Tolerance(0.1, 0.0, "test")
    assert tolerance.allows(1.09, 1.0) and not tolerance.allows(1.0, 0.9)


# -- comparison -------------------------------------------------------------------------------------------


def test_identical_records_agree() -> None:
    comparison = compare_steps(_record([1.0, 0.5]), _record([1.0, 0.5]), TIGHT)
    assert comparison.agree and [row["step"] for row in comparison.rows] == [1, 2]


def test_the_first_divergence_of_each_quantity_is_named_by_step() -> None:
    run = _record([1.0, 0.7, 0.9], norms=[1.0, 1.0, 3.0])
    ref = _record([1.0, 0.5, 0.4], norms=[1.0, 1.0, 2.0])
    comparison = compare_steps(run, ref, TIGHT)
    assert not comparison.agree
    lines = [d.line() for d in comparison.divergences]
    assert lines == [
        "first divergence: loss at step 2: 0.7 vs reference 0.5 (|diff| 0.2)",
        "first divergence: grad norm at step 3: 3 vs reference 2 (|diff| 1)",
    ]


def test_a_quantity_one_run_did_not_record_is_noted_not_failed() -> None:
    comparison = compare_steps(_record([1.0], norms=[None]), _record([1.0]), TIGHT)
    assert comparison.agree and any("grad norm: not recorded" in note for note in comparison.notes)


def test_an_optimizer_never_prepared_is_named_in_a_note() -> None:
    unprepared = {**_record([1.0, 0.9]), "optimizer_prepared": False}
    prepared = {**_record([1.0, 0.5]), "optimizer_prepared": True}
    comparison = compare_steps(unprepared, prepared, TIGHT)
    assert not comparison.agree and comparison.divergences[0].step == 2
    assert [note for note in comparison.notes if "never passed to accelerator.prepare" in note] == [
        UNPREPARED_OPTIMIZER_NOTE
    ]
    assert compare_steps(prepared, prepared, TIGHT).notes == []
    assert "note: the script steps an optimizer it never passed" in format_report(comparison, "run", "reference")


def test_the_parameter_with_the_largest_difference_is_named() -> None:
    comparison = compare_steps(_record([1.0]), _record([1.0]), TIGHT)
    run = {"a.weight": torch.ones(3), "b.weight": torch.tensor([1.0, 2.5]), "c.bias": torch.zeros(2)}
    ref = {"a.weight": torch.tensor([1.0, 1.0, 1.1]), "b.weight": torch.tensor([1.0, 2.0]), "c.bias": torch.zeros(2)}
    compare_parameters(run, ref, TIGHT, 5, comparison)
    assert comparison.divergences[-1].line() == (
        "first divergence: parameters after step 5: 2 of 3 tensors differ; largest difference in b.weight "
        "(max |diff| 0.5)"
    )
    assert comparison.parameter_diffs["c.bias"] == 0.0


def test_parameters_with_other_names_or_shapes_are_named() -> None:
    comparison = compare_steps(_record([1.0]), _record([1.0]), TIGHT)
    compare_parameters({"w": torch.ones(2), "extra": torch.ones(1)}, {"w": torch.ones(2)}, TIGHT, 1, comparison)
    assert "only in the run: extra" in comparison.divergences[-1].line()
    shapes = compare_steps(_record([1.0]), _record([1.0]), TIGHT)
    compare_parameters({"w": torch.ones(2)}, {"w": torch.ones(3)}, TIGHT, 1, shapes)
    assert "w has shape (2,) vs reference (3,)" in shapes.divergences[-1].line()


def test_the_report_shows_the_tolerance_the_table_and_the_divergences() -> None:
    comparison = compare_steps(_record([1.0, 0.7]), _record([1.0, 0.5]), TIGHT)
    text = format_report(comparison, "accel launch --use_fsdp", "ddp on 2 process(es)")
    lines = text.splitlines()
    assert lines[2] == "accel verify: tolerance: rtol=0.0001, atol=1e-06 (test)"
    assert lines[4].split()[:4] == ["1", "1", "=", "1"] and lines[5].split()[:4] == ["2", "0.7", "!=", "0.5"]
    assert lines[-2].startswith("first divergence: loss at step 2") and lines[-1] == "accel verify: the runs differ"
    assert comparison.to_dict()["result"] == "differ"


# -- the reference launch ---------------------------------------------------------------------------------


def test_launch_flags_survive_the_trip_to_the_launcher(tmp_path) -> None:
    argv = ["--num_processes", "2", "--use_fsdp", "--fsdp_version", "2", "--mixed_precision", "bf16"]
    args = verify_parser().parse_args([*argv, "--steps", "3", "--json", str(tmp_path / "r.json"), "train.py", "--x"])
    assert (args.steps, args.json_path, args.training_script_args) == (3, str(tmp_path / "r.json"), ["--x"])
    flags = given_flags(args)
    again = given_flags(launch_command_parser().parse_args([*flags_to_argv(flags), "train.py"]))
    assert again == flags


def _plan(argv: list[str]):
    return plan_launch(verify_parser().parse_args([*argv, "--quiet", "train.py"]))


def test_the_ddp_reference_keeps_processes_and_precision_and_drops_the_layout() -> None:
    plan = _plan(["--cpu", "--num_processes", "2", "--use_fsdp", "--mixed_precision", "bf16"])
    argv = reference_argv(plan, "ddp", {"cpu": True, "use_fsdp": True}, "/tmp/empty.json")
    assert argv == [
        "--config_file", "/tmp/empty.json", "--num_processes", "2", "--mixed_precision", "bf16", "--cpu",
    ]  # fmt: skip
    single = reference_argv(plan, "single", {"cpu": True}, "/tmp/empty.json")
    assert single[2:4] == ["--num_processes", "1"]
    env = reference_env({"FSDP_VERSION": "2", "PARALLELISM_CONFIG_TP_SIZE": "2", "HOME": "/h"}, plan, "single")
    assert env == {"HOME": "/h", "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "2"}


def test_the_reference_reads_what_the_run_s_data_parallel_ranks_read() -> None:
    # tp 2 on 4 processes: 2 data-parallel ranks (tensor-parallel peers read the same batches)
    plan = _plan(["--cpu", "--num_processes", "4", "--use_parallelism_config", "--parallelism_config_tp_size", "2"])
    argv = reference_argv(plan, "ddp", {"cpu": True}, "/tmp/empty.json", data_parallel=2)
    assert argv[2:4] == ["--num_processes", "2"]
    assert reference_argv(plan, "single", {"cpu": True}, "/tmp/empty.json", data_parallel=2)[2:4] == [
        "--num_processes",
        "1",
    ]
    env = reference_env({"ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "2"}, plan, "single", data_parallel=2)
    assert env == {"ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "4"}


def test_an_unknown_reference_or_several_machines_is_refused() -> None:
    plan = SimpleNamespace(num_machines=1, num_processes=2, values={}, env={})
    with pytest.raises(VerifyError, match="unknown reference 'fsdp': choose one of ddp, single"):
        reference_argv(plan, "fsdp", {}, "c.json")
    with pytest.raises(VerifyError, match="runs on one machine; the launch asks for 2 machines"):
        reference_argv(SimpleNamespace(num_machines=2, num_processes=4, values={}, env={}), "ddp", {}, "c.json")


# -- bad input on the command line and in Python ----------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--steps", "0"], "--steps must be a whole number of optimizer steps >= 1, got 0"),
        (["--reference", "fsdp"], "unknown reference 'fsdp': choose one of ddp, single"),
        (["--dry_run"], "--dry_run does not run the script"),
        (["--rtol", "-1"], "--rtol must be a finite number >= 0, got -1.0"),
        (
            ["--steps", "3", "--resume-at", "0"],
            "--resume-at must be a step from 1 to 2 (before the last of --steps 3), got 0",
        ),
        (
            ["--steps", "3", "--resume-at", "3"],
            "--resume-at must be a step from 1 to 2 (before the last of --steps 3), got 3",
        ),
        (["--resume-args=--resume {checkpoint}"], "--resume-args needs --resume-at K"),
        (["--resume-at", "1", "--resume-args", "--resume 'x"], '--resume-args "--resume \'x" cannot be split'),
    ],
)
def test_bad_input_is_one_line_and_exit_status_2(argv: list[str], message: str, capsys, tmp_path) -> None:
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('must not run')\n")
    assert main([*argv, "--cpu", str(script)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("accel verify: error: ") and message in err[0]


def test_the_python_entry_point_reports_bad_input_the_same_way(tmp_path) -> None:
    result = verify(str(tmp_path / "train.py"), steps=0)
    assert result.exit_code == 2 and not result.agree and "--steps must be" in result.report


def test_help_runs_as_a_module_and_names_the_verify_options() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "accel_launch.commands.verify", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for option in ("--steps", "--reference", "--rtol", "--atol", "--json PATH", "--resume-at K", "--resume-args ARGS"):
        assert option in out


# -- a run that records nothing usable ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (None, "the requested run ended without creating an Accelerator, so nothing was recorded"),
        ({"backward_calls": 0, "steps": []}, "the requested run never called accelerator.backward(loss)"),
        (
            {"backward_calls": 2, "complete": False, "steps": [{}, {}]},
            "the requested run ended after 2 of the 5 optimizer steps asked for",
        ),
    ],
)
def test_a_record_that_cannot_be_compared_is_named(record, message) -> None:
    from accel_launch.verify.runs import _check_record

    with pytest.raises(VerifyError) as error:
        _check_record(record, "requested", 5, "/tmp/requested.log")
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_script_that_fails_is_exit_2_with_the_end_of_its_output(tmp_path) -> None:
    from accel_launch.verify.runs import run_once

    script = tmp_path / "broken.py"
    script.write_text("raise RuntimeError('the data folder is missing')\n")
    with pytest.raises(VerifyError) as error:
        run_once("requested", ["--cpu", "--num_processes", "1"], [str(script)], 2, str(tmp_path), dict(os.environ))
    first, *rest = str(error.value).splitlines()
    assert first.startswith("the requested run failed (exit status 1); its output ended with")
    assert any("RuntimeError: the data folder is missing" in line for line in rest)


def test_the_tolerance_follows_the_precision_the_runs_recorded() -> None:
    from accel_launch.verify.compare import looser_precision

    assert looser_precision("no", "bf16") == "bf16"
    assert looser_precision("fp16", "bf16") == "bf16"
    assert looser_precision("no", None) == "no" and looser_precision("unknown") == "no"


# -- --resume-at: the resumed launch and its comparison ---------------------------------------------------


def test_the_resumed_run_is_resumed_by_the_recorder_unless_the_script_is_given_arguments(tmp_path) -> None:
    from accel_launch.verify.resume import resume_launch_args

    env, words = resume_launch_args(str(tmp_path), None)
    assert env == {"ACCEL_VERIFY_RESUME_DIR": str(tmp_path), "ACCEL_VERIFY_RESUME": "recorder"} and words == []
    (tmp_path / "resume.json").write_text('{"step": 2, "checkpoint": "/w/resume/state", "counts": {}}')
    env, words = resume_launch_args(str(tmp_path), "--resume_from {checkpoint} --skip-steps={step} '{x}'")
    assert env["ACCEL_VERIFY_RESUME"] == "script"
    assert words == ["--resume_from", "/w/resume/state", "--skip-steps=2", "{x}"]


def test_a_missing_resume_point_is_named(tmp_path) -> None:
    from accel_launch.verify.resume import resume_launch_args

    with pytest.raises(VerifyError, match=r"left no resume point .*resume.json.*--resume-at"):
        resume_launch_args(str(tmp_path), "--resume {checkpoint}")


def test_the_resumed_steps_are_compared_with_the_same_steps_of_the_uninterrupted_run() -> None:
    from accel_launch.verify.resume import compare_resumed

    uninterrupted = _record([1.0, 0.9, 0.8, 0.7])
    resumed = {
        "steps": [
            {"step": 3, "loss": 0.8, "grad_norm": 1.0, "lr": 0.01},
            {"step": 4, "loss": 0.75, "grad_norm": 1.0, "lr": 0.01},
        ]
    }
    params = {"w": torch.ones(2)}
    comparison = compare_resumed(uninterrupted, resumed, params, {"w": torch.tensor([1.0, 1.5])}, TIGHT, 2, 4)
    assert [row["step"] for row in comparison.rows] == [3, 4]
    lines = [d.line(comparison.against) for d in comparison.divergences]
    assert lines[0].startswith("first divergence: loss at step 4: 0.75 vs uninterrupted 0.7")
    assert lines[-1].startswith(
        "first divergence: parameters after step 4: 1 of 1 tensors differ; largest difference in w"
    )


def test_the_report_shows_the_resumed_run_in_a_section_of_its_own() -> None:
    from accel_launch.verify.resume import compare_resumed

    agree = compare_steps(_record([1.0, 0.9, 0.8]), _record([1.0, 0.9, 0.8]), TIGHT)
    resumed = compare_resumed(
        _record([1.0, 0.9, 0.8]),
        {"steps": [{"step": 3, "loss": 0.5, "grad_norm": 1.0, "lr": 0.01}]},
        {},
        {},
        TIGHT,
        2,
        3,
    )
    text = format_report(
        agree, "accel launch --num_processes 2", "ddp on 2 process(es)", (resumed, "saved after step 2")
    )
    lines = text.splitlines()
    assert "accel verify: resumed: saved after step 2" in lines
    assert any(line.startswith("resume: step  loss (resumed vs uninterrupted)") for line in lines)
    assert any(line.startswith("resume: first divergence: loss at step 3: 0.5 vs uninterrupted 0.8") for line in lines)
    assert lines[-1] == "accel verify: the runs differ"
