"""Schedulers' variables in the launch plan, with the source of each value; the failure summary."""

from __future__ import annotations

import io
import json
import signal
from types import SimpleNamespace

import pytest
from launch_helpers import run_cli

from accel_launch.commands.config.config_args import config_from_dict
from accel_launch.dry_run import print_plan
from accel_launch.launch_args import given_flags, launch_command_parser
from accel_launch.plan import MachineInfo, resolve
from accel_launch.runner import failure_summary
from accel_launch.values import ConfigError
from accel_state.cluster import launch_topology

CPU = MachineInfo("cpu", 0, 8)
GPU4 = MachineInfo("cuda", 4, 32)


def plan_of(argv: list[str], env: dict | None = None, config: dict | None = None, machine: MachineInfo = CPU):
    args = launch_command_parser().parse_args([*argv, "train.py"])
    cfg = config_from_dict(config, source="c.yaml") if config is not None else None
    topology = launch_topology(env or {})
    return resolve(
        given_flags(args), cfg, machine, args.training_script, args.training_script_args, topology, environ=env or {}
    )


PET = {
    "PET_NNODES": "2",
    "PET_NODE_RANK": "1",
    "PET_NPROC_PER_NODE": "2",
    "PET_MASTER_ADDR": "m",
    "PET_MASTER_PORT": "9",
}


def test_pet_variables_drive_a_launch_with_no_flags() -> None:
    plan = plan_of(["--cpu"], PET)
    assert (plan.num_machines, plan.machine_rank, plan.num_processes, plan.nproc_per_node) == (2, 1, 4, 2)
    assert (plan.main_process_ip, plan.main_process_port, plan.scheduler) == ("m", 9, "kubernetes")
    assert plan.sources["num_machines"] == "environment PET_NNODES"
    assert plan.sources["num_processes"] == "environment PET_NPROC_PER_NODE x PET_NNODES"


def test_flags_win_over_the_scheduler_which_wins_over_the_config_file() -> None:
    plan = plan_of(
        ["--cpu", "--machine_rank", "0"], PET, {"num_machines": 1, "machine_rank": 0, "main_process_ip": "x"}
    )
    assert plan.machine_rank == 0 and plan.sources["machine_rank"] == "flag --machine_rank"
    assert plan.num_machines == 2 and plan.main_process_ip == "m"


def test_slurm_fills_machines_rank_and_address() -> None:
    env = {"SLURM_JOB_ID": "5", "SLURM_NNODES": "2", "SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "node[3-4]"}
    plan = plan_of(["--cpu", "--num_processes", "4"], env)
    assert (plan.num_machines, plan.machine_rank, plan.main_process_ip, plan.scheduler) == (2, 1, "node3", "slurm")
    assert plan.sources["main_process_ip"] == "environment SLURM_JOB_NODELIST"


def test_plain_master_addr_only_completes_a_several_machine_run() -> None:
    one = plan_of(["--cpu"], {"MASTER_ADDR": "10.0.0.5"})
    assert one.main_process_ip is None and one.scheduler is None
    two = plan_of(["--cpu", "--num_machines", "2", "--num_processes", "2"], {"MASTER_ADDR": "10.0.0.5"})
    assert two.main_process_ip == "10.0.0.5" and two.sources["main_process_ip"] == "environment MASTER_ADDR"
    with pytest.raises(ConfigError, match="needs --main_process_ip"):
        plan_of(["--cpu", "--num_machines", "2", "--num_processes", "2"])


def test_gpu_request_without_gpu_runs_independent_cpu_processes_as_documented() -> None:
    plain = plan_of(["--multi_gpu", "--num_processes", "2"])
    assert plain.mode == "copies" and plain.num_processes == 2 and plain.values["cpu"]
    assert plain.env["ACCELERATE_USE_CPU"] == "true" and plain.sources["cpu"] == "chosen by the launcher (no GPU found)"
    assert len(plain.warnings) == 1 and "each process runs on the CPU on its own" in plain.warnings[0]
    assert "--cpu_fallback" in plain.warnings[0]  # the warning names the opt-in to one group
    from_file = plan_of([], config={"distributed_type": "MULTI_GPU", "num_processes": 2})
    assert from_file.mode == "copies" and from_file.warnings[0].startswith("multi_gpu (config file c.yaml)")
    assert plan_of(["--multi_gpu"]).mode == "simple"  # one process: nothing to copy
    gpu_ids = plan_of(["--gpu_ids", "0,1"])
    assert gpu_ids.mode == "simple" and "CUDA_VISIBLE_DEVICES" not in gpu_ids.env and "--gpu_ids" in gpu_ids.warnings[0]
    on_gpu = plan_of(["--multi_gpu", "--gpu_ids", "0,1"], machine=GPU4)
    assert on_gpu.env["CUDA_VISIBLE_DEVICES"] == "0,1" and not on_gpu.warnings and on_gpu.mode == "torchrun"
    assert not plan_of(["--gpu_ids", "all"]).warnings  # "all" asks for nothing in particular


def test_cpu_fallback_opts_in_to_one_gloo_group() -> None:
    fallback = plan_of(["--multi_gpu", "--gpu_ids", "0,1", "--cpu_fallback", "--num_processes", "2"])
    assert fallback.mode == "torchrun" and fallback.values["cpu"] and "CUDA_VISIBLE_DEVICES" not in fallback.env
    assert fallback.sources["cpu"] == "flag --cpu_fallback"
    assert len(fallback.warnings) == 1 and "one gloo group (--cpu_fallback)" in fallback.warnings[0]
    summary = io.StringIO()
    print_plan(fallback, as_json=True, out=summary)
    assert json.loads(summary.getvalue())["backend"] == {"value": "gloo", "source": "flag --cpu_fallback"}
    with_file = plan_of(
        ["--cpu_fallback"], config={"distributed_type": "MULTI_GPU", "num_processes": 2, "use_cpu": True}
    )
    assert with_file.mode == "torchrun" and with_file.sources["cpu"] == "config file c.yaml (use_cpu: true)"


MULTI_GPU_ON_CPU = {"distributed_type": "MULTI_GPU", "num_processes": 2, "use_cpu": True}


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        (["--multi_gpu", "--num_processes", "2"], {"ACCELERATE_USE_CPU": "true"}),
        (["--multi_gpu", "--gpu_ids", "0,1", "--num_processes", "2"], {"ACCELERATE_USE_CPU": "1"}),
    ],
)
def test_multi_gpu_with_the_cpu_chosen_in_the_environment_forms_one_group(argv: list[str], env: dict) -> None:
    # The documented launcher passes an exported ACCELERATE_USE_CPU on: its processes form a MULTI_CPU group.
    plan = plan_of(argv, env)
    assert plan.values["cpu"] and not plan.values["multi_gpu"] and plan.num_processes == 2
    assert plan.mode == "torchrun" and plan.env["ACCELERATE_USE_CPU"] == "true"
    assert "CUDA_VISIBLE_DEVICES" not in plan.env and plan.sources["cpu"] == "environment ACCELERATE_USE_CPU"
    assert not plan.warnings  # a choice, not a fall-back: nothing to warn about
    summary = io.StringIO()
    print_plan(plan, as_json=True, out=summary)
    assert json.loads(summary.getvalue())["backend"] == {"value": "gloo", "source": "environment ACCELERATE_USE_CPU"}


@pytest.mark.parametrize(
    ("argv", "config"), [(["--multi_gpu"], {"num_processes": 2, "use_cpu": True}), ([], MULTI_GPU_ON_CPU)]
)
def test_multi_gpu_with_use_cpu_in_the_file_runs_independent_processes(argv: list[str], config: dict) -> None:
    # The documented launcher does not pass a file's use_cpu to --multi_gpu processes: each stays alone.
    plan = plan_of(argv, None, config)
    assert plan.mode == "copies" and plan.num_processes == 2 and plan.env["ACCELERATE_USE_CPU"] == "true"
    assert plan.sources["cpu"] == "config file c.yaml (use_cpu: true)"
    assert "each process runs on the CPU on its own" in plan.warnings[0]
    summary = io.StringIO()
    print_plan(plan, as_json=True, out=summary)
    backend = json.loads(summary.getvalue())["backend"]
    assert backend == {"value": "none (each process on its own)", "source": "config file c.yaml (use_cpu: true)"}


def test_the_cpu_choice_does_not_override_gpus_that_exist() -> None:
    flag_over_file = plan_of(["--multi_gpu"], config={"num_processes": 2, "use_cpu": True}, machine=GPU4)
    assert not flag_over_file.values["cpu"] and flag_over_file.env["ACCELERATE_USE_CPU"] == "false"
    file_alone = plan_of([], config=MULTI_GPU_ON_CPU, machine=GPU4)
    assert file_alone.mode == "torchrun" and file_alone.env["ACCELERATE_USE_CPU"] == "false"
    with_env = plan_of(["--multi_gpu", "--num_processes", "2"], {"ACCELERATE_USE_CPU": "true"}, machine=GPU4)
    assert with_env.values["multi_gpu"] and "ACCELERATE_USE_CPU" in with_env.defaulted_env  # the exported value wins


def test_the_cpu_choice_is_read_only_where_it_matters_and_must_be_a_boolean() -> None:
    assert plan_of(["--multi_gpu", "--num_processes", "2"], {"ACCELERATE_USE_CPU": "false"}).mode == "copies"
    with pytest.raises(ConfigError, match=r"ACCELERATE_USE_CPU='maybe' in the environment is not a boolean"):
        plan_of(["--multi_gpu"], {"ACCELERATE_USE_CPU": "maybe"})
    assert plan_of(["--cpu"], {"ACCELERATE_USE_CPU": "maybe"}).values["cpu"]  # not consulted: no GPU asked for
    with pytest.raises(ConfigError, match="--cpu cannot be combined with --multi_gpu"):  # both flags: as documented
        plan_of(["--cpu", "--multi_gpu"], {"ACCELERATE_USE_CPU": "true"})


def test_multi_gpu_with_the_cpu_chosen_in_the_environment_starts_two_cpu_processes(tmp_path, config_home) -> None:
    from accel_launch.machine import detect_machine

    if detect_machine().has_accelerator:
        pytest.skip("with an accelerator --multi_gpu runs there; this checks the machine without one")
    script = tmp_path / "report.py"
    script.write_text(
        "import sys\nimport torch\nfrom accel_state.state import PartialState\nfrom accel_state.operations import reduce\n"
        "s = PartialState()\ntotal = reduce(torch.tensor([1.0]), reduction='sum').item()\n"
        # one write per line: the two processes share the launcher's stdout, and print() of several
        # values writes them piece by piece, so two ranks' lines could interleave
        "sys.stdout.write(f'RANK {s.process_index} {s.num_processes} {s.distributed_type} {s.backend} {total}\\n')\n"
        "sys.stdout.flush()\n"
    )
    shown = run_cli(
        ["launch", "--multi_gpu", "--num_processes", "2", str(script)],
        env={"ACCELERATE_USE_CPU": "true", "HF_HOME": str(config_home)},
        timeout=240,
    )
    assert shown.returncode == 0, shown.stderr[-3000:]
    ranks = sorted(line.split()[1:] for line in shown.stdout.splitlines() if line.startswith("RANK"))
    assert ranks == [[str(rank), "2", "DistributedType.MULTI_CPU", "gloo", "2.0"] for rank in (0, 1)]  # one group


def test_dry_run_text_names_each_source() -> None:
    out = io.StringIO()
    print_plan(plan_of(["--cpu", "--mixed_precision", "bf16"], PET), out=out)
    text = out.getvalue()
    assert "nothing was started" in text
    assert "[environment PET_NNODES]" in text and "[flag --mixed_precision]" in text
    summary = io.StringIO()
    print_plan(plan_of(["--cpu"], PET), as_json=True, out=summary)
    data = json.loads(summary.getvalue())
    assert data["ranks_on_this_machine"] == [2, 3] and data["scheduler"] == "kubernetes"


def _failure(code: int, when: int) -> SimpleNamespace:
    return SimpleNamespace(exitcode=code, timestamp=when)


def test_failure_summary_names_the_first_real_failure() -> None:
    stopped = -int(signal.SIGTERM)
    text = failure_summary({0: _failure(stopped, 10), 1: _failure(1, 10)})
    assert text == "rank 1 failed first (exit code 1); rank 0 was stopped by the launcher"
    text = failure_summary({2: _failure(3, 11), 0: _failure(4, 10), 1: _failure(stopped, 12)})
    assert text.startswith("rank 0 failed first (exit code 4); rank 2 failed too; rank 1 was stopped")
    assert failure_summary({1: _failure(-int(signal.SIGKILL), 5)}) == "rank 1 failed first (killed by SIGKILL)"
