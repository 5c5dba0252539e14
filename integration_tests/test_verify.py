"""`accel verify` through the real launcher on gloo processes: FSDP2 agrees with DDP; a loss scaled by the
process index is caught at step 1 and named; a script that never calls ``backward`` or ends before the
steps asked for is one clear line with exit status 2; ``--resume-at``: DDP resumed by the recorder equals
its uninterrupted run, and a script that resumes by itself but skips the seen batches twice is caught at
the first step after the resume; layouts: dp_shard x tp on 4 processes in bf16 (against DDP on its 2
data-parallel ranks, with the looser bf16 tolerance) and ZeRO-3 without the 16-bit export."""

from __future__ import annotations

import json
import textwrap

import pytest
from conftest import accel_command, run_command

from accel_state.imports import is_deepspeed_available

SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    from accel import Accelerator

    class Net(torch.nn.Module):
        _tp_plan = {"inp": "colwise", "mid": "rowwise"}  # used only by tensor-parallel launches

        def __init__(self):
            super().__init__()
            self.inp = torch.nn.Linear(4, 16)
            self.mid = torch.nn.Linear(16, 16)
            self.head = torch.nn.Linear(16, 1)
        def forward(self, x):
            return self.head(torch.relu(self.mid(torch.relu(self.inp(x)))))

    args = sys.argv[1:]
    batches = int(args[args.index("--batches") + 1]) if "--batches" in args else 16
    accelerator = Accelerator()
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4, generator=generator), torch.randn(64, 1, generator=generator))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    if "--resume" in args:  # the script's own resume (accel verify --resume-args gives these)
        accelerator.load_state(args[args.index("--resume") + 1])
        seen = int(args[args.index("--resume-step") + 1])
        loader = accelerator.skip_first_batches(loader, seen)
    for index, (x, y) in enumerate(loader):
        if index == batches:
            break
        if "--resume" in args and "--skip-twice" in args and index < seen:  # the deliberate mistake
            continue
        with accelerator.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(x), y)
            if "--scale-by-rank" in args:  # the deliberate mistake
                loss = loss * (1 + accelerator.process_index)
            if "--no-backward" in args:
                loss.backward()
            else:
                accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    """
)


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    return path


def _verify(args: list[str], tmp_path):
    # TMPDIR: the work folder a failed run keeps (its logs) stays inside the test's folder
    return run_command([*accel_command(), "verify", *args], timeout=300, env={"TMPDIR": str(tmp_path)})


def test_fsdp2_trains_the_same_model_as_ddp(script, tmp_path) -> None:
    record = tmp_path / "record.json"
    result = _verify(
        [
            "--num_processes",
            "2",
            "--use_fsdp",
            "--fsdp_version",
            "2",
            "--steps",
            "3",
            "--json",
            str(record),
            str(script),
        ],
        tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "tolerance: rtol=0.0001, atol=1e-06 (float32 default)" in result.stdout
    assert result.stdout.strip().endswith("accel verify: the runs agree")
    saved = json.loads(record.read_text())
    assert saved["result"] == "agree" and [step["step"] for step in saved["steps"]] == [1, 2, 3]
    assert saved["records"]["run"]["distributed_type"] == "FSDP"
    assert saved["records"]["reference"]["distributed_type"] == "MULTI_CPU"


def test_a_loss_scaled_by_the_process_index_is_caught_at_step_1(script, tmp_path) -> None:
    result = _verify(
        ["--num_processes", "2", "--reference", "single", "--steps", "2", str(script), "--scale-by-rank"], tmp_path
    )
    assert result.returncode == 1, result.stdout + result.stderr
    divergences = [line for line in result.stdout.splitlines() if line.startswith("first divergence:")]
    assert divergences[0].startswith("first divergence: loss at step 1: ")
    assert any(line.startswith("first divergence: parameters after step 2: ") for line in divergences)
    assert result.stdout.strip().endswith("accel verify: the runs differ")


@pytest.mark.parametrize(
    ("script_args", "message"),
    [
        (["--no-backward"], "the requested run never called accelerator.backward(loss)"),
        (["--batches", "2"], "the requested run ended after 2 of the 3 optimizer steps asked for"),
    ],
)
def test_a_run_that_does_not_record_its_steps_is_one_line_and_exit_2(script, script_args, message, tmp_path) -> None:
    result = _verify(["--num_processes", "1", "--steps", "3", str(script), *script_args], tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("accel verify: error: ") and message in lines[0], result.stderr
    assert f"its output: {tmp_path}" in lines[0]  # the log it names is kept


def test_ddp_resumed_after_step_2_by_the_recorder_continues_like_the_uninterrupted_run(script, tmp_path) -> None:
    record = tmp_path / "record.json"
    result = _verify(
        ["--num_processes", "2", "--steps", "3", "--resume-at", "2", "--json", str(record), str(script)], tmp_path
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "accel verify: resumed: saved after step 2, loaded by the recorder, steps 3-3" in result.stdout
    assert result.stdout.strip().endswith("accel verify: the runs agree")
    saved = json.loads(record.read_text())
    assert saved["result"] == "agree" and saved["resume"]["at"] == 2
    assert [step["step"] for step in saved["resume"]["steps"]] == [3]
    resumed = saved["records"]["resumed"]
    assert resumed["first_step"] == 3 and resumed["resumed_by"] == "recorder" and resumed["num_processes"] == 2
    assert saved["records"]["run"]["save_at"] == 2


def test_a_script_that_skips_the_seen_batches_twice_after_resuming_is_caught_at_step_3(script, tmp_path) -> None:
    resume_args = "--resume {checkpoint} --resume-step {step}"
    result = _verify(
        ["--num_processes", "1", "--steps", "3", "--resume-at", "2", "--resume-args", resume_args]
        + [str(script), "--skip-twice"],
        tmp_path,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    # the run and its reference agree: only the resumed run differs, from its first step on
    assert not any(line.startswith("first divergence:") for line in lines)
    divergences = [line for line in lines if line.startswith("resume: first divergence:")]
    assert divergences[0].startswith("resume: first divergence: loss at step 3: "), result.stdout
    assert any(line.startswith("resume: first divergence: parameters after step 3: ") for line in divergences)
    assert result.stdout.strip().endswith("accel verify: the runs differ")


@pytest.mark.release(
    covered_by="accel-launch test_verify.py::test_the_reference_reads_what_the_run_s_data_parallel_ranks_read "
    "(the reference's size for a TP run) and test_fsdp2_trains_the_same_model_as_ddp (the comparison)"
)
def test_dp_shard_x_tp_on_4_processes_in_bf16_agrees_with_ddp_on_its_2_data_parallel_ranks(script, tmp_path) -> None:
    sizes = ["--parallelism_config_dp_shard_size", "2", "--parallelism_config_tp_size", "2"]
    result = _verify(
        ["--num_processes", "4", "--use_parallelism_config", *sizes, "--mixed_precision", "bf16", "--steps", "2"]
        + [str(script)],
        tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # tensor-parallel peers read the same batches: the reference reads them with 2 processes, not 4
    assert "accel verify: reference: ddp on 2 process(es), one per data-parallel rank of the run" in result.stdout
    assert "accel verify: tolerance: rtol=0.02, atol=0.001 (bf16 default)" in result.stdout
    assert result.stdout.strip().endswith("accel verify: the runs agree")


@pytest.mark.skipif(not is_deepspeed_available(), reason='needs "accel-train[deepspeed]"')
def test_zero3_without_the_16bit_export_agrees_with_one_process(script, tmp_path) -> None:
    record = tmp_path / "record.json"
    zero3 = ["--use_deepspeed", "--zero_stage", "3", "--zero3_init_flag", "false"]
    result = _verify(
        ["--num_processes", "2", *zero3, "--reference", "single", "--steps", "2", "--json", str(record), str(script)],
        tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "note: grad norm: not recorded by one of the runs (fp16 scaler or DeepSpeed), not compared" in result.stdout
    saved = json.loads(record.read_text())
    assert saved["records"]["run"]["distributed_type"] == "DEEPSPEED" and saved["parameter_max_abs_diff"]
