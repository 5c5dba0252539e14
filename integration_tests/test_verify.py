"""`accel verify` through the real launcher on gloo processes: FSDP2 agrees with DDP; deliberate mistakes are
caught at step 1 and named (a loss scaled by the process index, weights initialized per process under FSDP2
without synced module states, a row-parallel layer left without its all-reduce, an optimizer never passed to
prepare under FSDP2); a script that never calls ``backward`` or ends before the steps asked for is
one clear line with exit status 2; ``--resume-at``: DDP resumed by the recorder equals its uninterrupted run,
and a script that resumes by itself but skips the seen batches twice is caught at the first step after the
resume; layouts: dp_shard x tp on 4 processes in bf16 (against DDP on its 2 data-parallel ranks, with the
looser bf16 tolerance) and ZeRO-3 without the 16-bit export; before a release, ``--resume-at 2`` in every
layout."""

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
    if "--tp-no-reduce" in args:  # the deliberate mistake: 'mid' keeps its partial sums (no all-reduce)
        from torch.distributed.tensor import Partial
        from torch.distributed.tensor.parallel import RowwiseParallel

        Net._tp_plan = {"inp": "colwise", "mid": RowwiseParallel(output_layouts=Partial())}
    accelerator = Accelerator()
    # the deliberate mistake: each process initializes its own weights (DDP and synced FSDP hide it)
    torch.manual_seed(accelerator.process_index if "--init-per-rank" in args else 0)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4, generator=generator), torch.randn(64, 1, generator=generator))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    if "--optimizer-not-prepared" in args:  # the deliberate mistake: the optimizer keeps the unprepared parameters
        model, loader = accelerator.prepare(model, loader)
    else:
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


def test_weights_initialized_per_process_are_caught_at_step_1_under_fsdp2_without_synced_states(
    script, tmp_path
) -> None:
    # the launcher's defaults (cpu_ram_efficient_loading, which implies sync_module_states) load process 0's weights
    fsdp2 = ["--use_fsdp", "--fsdp_version", "2", "--fsdp_cpu_ram_efficient_loading", "false"]
    fsdp2 += ["--fsdp_sync_module_states", "false"]
    result = _verify(["--num_processes", "2", *fsdp2, "--steps", "2", str(script), "--init-per-rank"], tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    # DDP (the reference) starts every process from process 0's weights; each FSDP2 shard kept its own
    divergences = [line for line in result.stdout.splitlines() if line.startswith("first divergence:")]
    assert divergences[0].startswith("first divergence: loss at step 1: "), result.stdout
    assert any(line.startswith("first divergence: parameters after step 2: ") for line in divergences)


def test_a_row_parallel_layer_left_without_its_reduction_is_caught_at_step_1(script, tmp_path) -> None:
    tp = ["--use_parallelism_config", "--parallelism_config_tp_size", "2"]
    result = _verify(["--num_processes", "2", *tp, "--steps", "2", str(script), "--tp-no-reduce"], tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "accel verify: reference: ddp on 1 process(es), one per data-parallel rank of the run" in result.stdout
    divergences = [line for line in result.stdout.splitlines() if line.startswith("first divergence:")]
    assert divergences[0].startswith("first divergence: loss at step 1: "), result.stdout


def test_an_optimizer_never_passed_to_prepare_is_caught_at_step_1_under_fsdp2_and_named(script, tmp_path) -> None:
    fsdp2 = ["--use_fsdp", "--fsdp_version", "2"]
    result = _verify(
        ["--num_processes", "2", *fsdp2, "--steps", "2", str(script), "--optimizer-not-prepared"], tmp_path
    )
    assert result.returncode == 1, result.stdout + result.stderr
    # under DDP (the reference) it still holds the model's parameters; FSDP2 replaced them by shards it never
    # updates: its own parameters get no gradient (norm 0 at step 1), and the loss parts at step 2
    divergences = [line for line in result.stdout.splitlines() if line.startswith("first divergence:")]
    assert divergences[0].startswith("first divergence: grad norm at step 1: 0 vs reference "), result.stdout
    assert any(line.startswith("first divergence: loss at step 2: ") for line in divergences)
    assert "note: the script steps an optimizer it never passed to accelerator.prepare" in result.stdout


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


PIPELINE_SCRIPT = textwrap.dedent(
    """
    import os
    import torch
    from accel import Accelerator, ParallelismConfig
    from accel.utils import PipelineParallelConfig

    def mse(output, target):
        return torch.nn.functional.mse_loss(output, target)

    stages = int(os.environ.get("PARALLELISM_CONFIG_PP_SIZE", "1"))  # the reference runs without the pipeline
    if stages > 1:
        pipeline = PipelineParallelConfig(schedule="1f1b", num_microbatches=2, loss_fn=mse)
        accelerator = Accelerator(parallelism_config=ParallelismConfig(pp_size=stages, pp_handler=pipeline))
    else:
        accelerator = Accelerator()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4, generator=generator), torch.randn(64, 1, generator=generator))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for x, y in loader:
        with accelerator.accumulate(model):
            loss = model(x, target=y) if stages > 1 else mse(model(x), y)  # the pipeline runs forward and backward
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    """
)


def test_two_pipeline_stages_train_like_one_process_and_resume_exactly(tmp_path) -> None:
    script = tmp_path / "pipeline_train.py"
    script.write_text(PIPELINE_SCRIPT)
    pipeline = ["--use_parallelism_config", "--parallelism_config_pp_size", "2"]
    result = _verify(["--num_processes", "2", *pipeline, "--steps", "3", "--resume-at", "2", str(script)], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    # pipeline peers read the same batches: the reference is one process
    assert "accel verify: reference: ddp on 1 process(es), one per data-parallel rank of the run" in result.stdout
    assert "accel verify: resumed: saved after step 2, loaded by the recorder, steps 3-3" in result.stdout
    assert result.stdout.strip().endswith("accel verify: the runs agree")


_DEEPSPEED = pytest.mark.skipif(not is_deepspeed_available(), reason='needs "accel-train[deepspeed]"')
#: Layouts whose ``--resume-at`` run must equal its own uninterrupted run (and the run its DDP reference).
RESUME_LAYOUTS = {
    "fsdp2": ["--num_processes", "2", "--use_fsdp", "--fsdp_version", "2"],
    "fsdp1": ["--num_processes", "2", "--use_fsdp", "--fsdp_version", "1"],
    "zero2": ["--num_processes", "2", "--use_deepspeed", "--zero_stage", "2"],
    "zero3": ["--num_processes", "2", "--use_deepspeed", "--zero_stage", "3", "--zero3_init_flag", "false"],
    "tp": ["--num_processes", "2", "--use_parallelism_config", "--parallelism_config_tp_size", "2"],
    "dp_shard-x-tp": ["--num_processes", "4", "--use_parallelism_config", "--parallelism_config_dp_shard_size", "2"]
    + ["--parallelism_config_tp_size", "2"],
    "bf16": ["--num_processes", "2", "--mixed_precision", "bf16"],
    "accumulation-2": ["--num_processes", "2", "--gradient_accumulation_steps", "2"],
}


@pytest.mark.release(
    covered_by="test_ddp_resumed_after_step_2_by_the_recorder_continues_like_the_uninterrupted_run (the recorder's "
    "resume) and accel-train's test_contract_resume.py::test_a_resumed_run_equals_the_uninterrupted_one (exact "
    "resume of every backend)"
)
@pytest.mark.parametrize(
    "layout",
    [pytest.param(name, marks=[_DEEPSPEED] if name.startswith("zero") else []) for name in RESUME_LAYOUTS],
)
def test_resume_at_2_continues_like_the_uninterrupted_run_in_every_layout(script, tmp_path, layout: str) -> None:
    result = _verify([*RESUME_LAYOUTS[layout], "--steps", "3", "--resume-at", "2", str(script)], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "accel verify: resumed: saved after step 2, loaded by the recorder, steps 3-3" in result.stdout
    assert result.stdout.strip().endswith("accel verify: the runs agree")
