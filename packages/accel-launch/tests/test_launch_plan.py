"""Config + flags -> launch plan and environment: pure functions, tested in-process."""

from __future__ import annotations

import sys

import pytest

from accel_launch.commands.config.config_args import config_from_dict
from accel_launch.commands_build import deepspeed_command, mpirun_command, script_command, torchrun_args
from accel_launch.launch_args import given_flags, launch_command_parser
from accel_launch.plan import MachineInfo, resolve
from accel_launch.values import ConfigError
from accel_state import env_vars

CPU = MachineInfo("cpu", 0, 8)
GPU4 = MachineInfo("cuda", 4, 32)


def plan_of(argv: list[str], config: dict | None = None, machine: MachineInfo = CPU):
    args = launch_command_parser().parse_args([*argv, "train.py", "--lr", "1"])
    cfg = config_from_dict(config) if config is not None else None
    return resolve(given_flags(args), cfg, machine, args.training_script, args.training_script_args)


def test_no_config_no_flags_on_cpu_is_one_cpu_process() -> None:
    plan = plan_of([])
    assert plan.mode == "simple" and plan.num_processes == 1
    assert plan.env["ACCELERATE_USE_CPU"] == "true"
    assert any("CPU" in note for note in plan.notes)


def test_no_config_no_flags_uses_every_gpu() -> None:
    plan = plan_of([], machine=GPU4)
    assert plan.mode == "torchrun" and plan.num_processes == 4
    assert plan.env["ACCELERATE_USE_CPU"] == "false"
    assert plan.env["ACCELERATE_MIXED_PRECISION"] == "no"


def test_cpu_two_processes_goes_through_torchrun() -> None:
    plan = plan_of(["--cpu", "--num_processes", "2"])
    assert plan.mode == "torchrun" and plan.nproc_per_node == 2
    assert plan.env["OMP_NUM_THREADS"] == "4"  # 8 cores / 2 processes
    args = torchrun_args(plan, 1234)
    assert args[args.index("--nproc_per_node") + 1] == "2"
    assert args[args.index("--master_port") + 1] == "1234"
    assert args[-3:] == ["train.py", "--lr", "1"]


def test_flags_over_config_over_defaults() -> None:
    config = {"distributed_type": "MULTI_GPU", "num_processes": 2, "mixed_precision": "fp16", "gpu_ids": "0,1"}
    plan = plan_of(["--num_processes", "3"], config, GPU4)
    assert plan.num_processes == 3  # flag
    assert plan.env["ACCELERATE_MIXED_PRECISION"] == "fp16"  # file
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "0,1"  # file
    assert plan.values["max_restarts"] == 0  # default


def test_config_distributed_type_selects_paradigm() -> None:
    plan = plan_of(
        [],
        {
            "distributed_type": "FSDP",
            "num_processes": 2,
            "fsdp_config": {"fsdp_sharding_strategy": 2, "fsdp_auto_wrap_policy": "size_based_wrap"},
        },
        GPU4,
    )
    assert plan.env["ACCELERATE_USE_FSDP"] == "true"
    assert plan.env["FSDP_SHARDING_STRATEGY"] == "SHARD_GRAD_OP"
    assert plan.env["FSDP_AUTO_WRAP_POLICY"] == "SIZE_BASED_WRAP"
    assert "ACCELERATE_USE_DEEPSPEED" not in plan.env


def test_paradigm_flag_replaces_config_paradigm() -> None:
    plan = plan_of(["--use_fsdp"], {"distributed_type": "DEEPSPEED", "num_processes": 2}, GPU4)
    assert plan.env["ACCELERATE_USE_FSDP"] == "true" and "ACCELERATE_USE_DEEPSPEED" not in plan.env
    on_gpu = plan_of(["--multi_gpu"], {"distributed_type": "MULTI_CPU", "use_cpu": True, "num_processes": 2}, GPU4)
    assert on_gpu.env["ACCELERATE_USE_CPU"] == "false" and on_gpu.num_processes == 2


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--use_fsdp", "--use_deepspeed"], "--use_deepspeed and --use_fsdp cannot be combined"),
        (["--use-fsdp", "--use-megatron-lm"], "cannot be combined"),
        (["--num_processes", "0"], "--num_processes must be at least 1, got 0"),
        (["--num_processes", "3", "--num_machines", "2", "--main_process_ip", "10.0.0.1"], "multiple of"),
        (["--num_machines", "2", "--num_processes", "2"], "--main_process_ip"),
        (
            ["--num_machines", "2", "--machine_rank", "2", "--main_process_ip", "1.2.3.4"],
            "--machine_rank must be between 0 and 1",
        ),
        (["--cpu", "--multi_gpu"], "--cpu cannot be combined with --multi_gpu"),
        (["--tpu", "--use_fsdp"], "--tpu cannot be combined"),
        (["-m", "--no_python"], "cannot be combined"),
        (["--main_process_port", "70000"], "port number"),
        (["--use_deepspeed", "--zero_stage", "5"], "--zero_stage must be 0, 1, 2 or 3"),
        (["--use_fsdp", "--fsdp_offload_params", "perhaps"], "'fsdp_offload_params' must be a boolean"),
        (["--use_fsdp", "--fsdp_state_dict_type", "FULL"], "fsdp_state_dict_type"),
        (["--num_cpu_threads_per_process", "0"], "at least 1"),
    ],
)
def test_bad_flags_are_clear_errors(argv: list[str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        plan_of(argv, machine=GPU4)


def test_kebab_case_aliases() -> None:
    snake = plan_of(["--num_processes", "2", "--mixed_precision", "bf16", "--main_process_port", "2345", "--cpu"])
    kebab = plan_of(["--num-processes", "2", "--mixed-precision", "bf16", "--main-process-port", "2345", "--cpu"])
    assert snake.values == kebab.values and snake.env == kebab.env


def test_every_snake_flag_has_a_kebab_alias() -> None:
    parser = launch_command_parser()
    strings = {s for action in parser._actions for s in action.option_strings}
    for action in parser._actions:
        for flag in action.option_strings:
            if flag.startswith("--") and "_" in flag:
                assert flag.replace("_", "-") in strings


def test_script_command_variants() -> None:
    assert script_command(plan_of(["--cpu"]))[1:] == ["train.py", "--lr", "1"]
    assert script_command(plan_of(["--cpu"]))[0] == sys.executable
    assert script_command(plan_of(["-m", "--cpu"]))[1:3] == ["-m", "train.py"]
    assert script_command(plan_of(["--no_python", "--cpu"]))[0] == "train.py"


def test_torchrun_arguments_carry_flags() -> None:
    plan = plan_of(
        [
            "--cpu",
            "--num_processes",
            "4",
            "--num_machines",
            "2",
            "--machine_rank",
            "1",
            "--main_process_ip",
            "10.1.1.1",
            "--tee",
            "3",
            "--log_dir",
            "/tmp/logs",
            "--max_restarts",
            "2",
            "--monitor_interval",
            "0.5",
            "--role",
            "trainer",
            "-m",
        ]
    )
    args = torchrun_args(plan, 29500)
    pairs = dict(zip(args[:-4:2], args[1:-4:2]))
    assert pairs["--nnodes"] == "2" and pairs["--nproc_per_node"] == "2"
    # --max_restarts: c10d rendezvous (static cannot restart; see test_launch_restarts.py)
    assert pairs["--rdzv_endpoint"] == "10.1.1.1:29500" and pairs["--rdzv_backend"] == "c10d"
    assert pairs["--tee"] == "3" and pairs["--log_dir"] == "/tmp/logs"
    assert pairs["--max_restarts"] == "2" and pairs["--monitor_interval"] == "0.5" and pairs["--role"] == "trainer"
    assert "--module" in args


def test_c10d_rendezvous_uses_endpoint() -> None:
    plan = plan_of(
        [
            "--cpu",
            "--num_processes",
            "2",
            "--rdzv_backend",
            "c10d",
            "--rdzv_conf",
            "timeout=30",
            "--main_process_ip",
            "host0",
        ]
    )
    args = torchrun_args(plan, 4000)
    assert args[args.index("--rdzv_endpoint") + 1] == "host0:4000"
    assert args[args.index("--rdzv_conf") + 1] == "timeout=30"
    assert "--master_addr" not in args


def test_deepspeed_env_and_multinode_command() -> None:
    config = {
        "distributed_type": "DEEPSPEED",
        "num_processes": 16,
        "num_machines": 2,
        "main_process_ip": "10.0.0.1",
        "main_process_port": 29501,
        "mixed_precision": "bf16",
        "deepspeed_config": {
            "zero_stage": 3,
            "offload_optimizer_device": "cpu",
            "zero3_init_flag": True,
            "gradient_accumulation_steps": 4,
            "gradient_clipping": "auto",
            "deepspeed_hostfile": "/etc/hosts.ds",
            "deepspeed_inclusion_filter": "n1",
            "deepspeed_multinode_launcher": "pdsh",
        },
    }
    plan = plan_of([], config, GPU4)
    assert plan.mode == "deepspeed"
    env = plan.env
    assert env["ACCELERATE_USE_DEEPSPEED"] == "true" and env["ACCELERATE_DEEPSPEED_ZERO_STAGE"] == "3"
    assert (
        env["ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE"] == "cpu"
        and env["ACCELERATE_DEEPSPEED_ZERO3_INIT"] == "true"
    )
    assert env["ACCELERATE_GRADIENT_ACCUMULATION_STEPS"] == "4" and "ACCELERATE_GRADIENT_CLIPPING" not in env
    assert "mixed_precision" in env["ACCELERATE_CONFIG_DS_FIELDS"].split(",")
    cmd = deepspeed_command(plan, 29501)
    assert cmd[0] == "deepspeed"
    assert cmd[cmd.index("--hostfile") + 1] == "/etc/hosts.ds" and cmd[cmd.index("--include") + 1] == "n1"
    assert cmd[cmd.index("--num_nodes") + 1] == "2" and cmd[cmd.index("--num_gpus") + 1] == "8"
    assert cmd[cmd.index("--launcher") + 1] == "pdsh" and cmd[-3:] == ["train.py", "--lr", "1"]


def test_deepspeed_standard_launcher_uses_torchrun() -> None:
    plan = plan_of(
        [
            "--use_deepspeed",
            "--num_machines",
            "2",
            "--num_processes",
            "2",
            "--main_process_ip",
            "h",
            "--deepspeed_multinode_launcher",
            "standard",
        ],
        machine=GPU4,
    )
    assert plan.mode == "torchrun"


def test_fsdp2_env() -> None:
    plan = plan_of(
        [
            "--use_fsdp",
            "--fsdp_version",
            "2",
            "--fsdp_reshard_after_forward",
            "false",
            "--fsdp_transformer_layer_cls_to_wrap",
            "Block",
        ],
        machine=GPU4,
    )
    assert plan.env["FSDP_VERSION"] == "2" and plan.env["FSDP_RESHARD_AFTER_FORWARD"] == "false"
    assert plan.env["FSDP_TRANSFORMER_CLS_TO_WRAP"] == "Block"
    assert "FSDP_SHARDING_STRATEGY" not in plan.env


def test_megatron_fp8_dynamo_env() -> None:
    plan = plan_of(
        [
            "--use_megatron_lm",
            "--megatron_lm_tp_degree",
            "2",
            "--megatron_lm_sequence_parallelism",
            "true",
            "--mixed_precision",
            "fp8",
            "--fp8_backend",
            "te",
            "--fp8_override_linear_precision",
            "false,false,true",
            "--dynamo_backend",
            "inductor",
            "--dynamo_use_fullgraph",
        ],
        machine=GPU4,
    )
    env = plan.env
    assert env["ACCELERATE_USE_MEGATRON_LM"] == "true" and env["MEGATRON_LM_TP_DEGREE"] == "2"
    assert env["MEGATRON_LM_SEQUENCE_PARALLELISM"] == "true"
    assert (
        env["ACCELERATE_FP8_BACKEND"] == "TE" and env["ACCELERATE_FP8_OVERRIDE_LINEAR_PRECISION"] == "false,false,true"
    )
    assert env["ACCELERATE_DYNAMO_BACKEND"] == "INDUCTOR" and env["ACCELERATE_DYNAMO_USE_FULLGRAPH"] == "true"


def test_env_values_read_back_through_protocol() -> None:
    plan = plan_of(
        ["--use_fsdp", "--fsdp_offload_params", "true", "--mixed_precision", "bf16", "--debug"], machine=GPU4
    )
    assert env_vars.read("FSDP_OFFLOAD_PARAMS", plan.env) is True
    assert env_vars.read("ACCELERATE_MIXED_PRECISION", plan.env) == "bf16"
    assert env_vars.read("ACCELERATE_DEBUG_MODE", plan.env) is True
    for name in plan.env:
        if name.startswith(("ACCELERATE_", "FSDP_", "MEGATRON_LM_")):
            env_vars.read(name, plan.env)  # every variable is part of the protocol and parses


def test_cpu_affinity_threads_gpu_ids() -> None:
    plan = plan_of(
        ["--multi_gpu", "--gpu_ids", "1,3", "--enable_cpu_affinity", "--num_cpu_threads_per_process", "6"], machine=GPU4
    )
    assert plan.num_processes == 2  # one per selected GPU
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "1,3" and plan.env["ACCELERATE_CPU_AFFINITY"] == "true"
    assert plan.env["OMP_NUM_THREADS"] == "6"


def test_multi_cpu_config_and_mpirun() -> None:
    config = {
        "distributed_type": "MULTI_CPU",
        "num_processes": 4,
        "num_machines": 2,
        "main_process_ip": "10.0.0.1",
        "use_cpu": True,
        "mpirun_config": {"mpirun_hostfile": "/h", "mpirun_ccl": 2},
        "ipex_config": {"ipex": True},
    }
    plan = plan_of([], config)
    assert plan.mode == "mpirun" and plan.env["ACCELERATE_USE_IPEX"] == "true" and plan.env["CCL_WORKER_COUNT"] == "2"
    assert mpirun_command(plan) == ["mpirun", "-f", "/h", "-ppn", "2", "-n", "4"]


def test_tpu_modes() -> None:
    assert plan_of(["--tpu"]).mode == "tpu"
    assert plan_of(["--tpu", "--tpu_cluster"]).mode == "tpu_pod"
    assert plan_of(["--tpu", "--tpu_cluster", "--no_tpu_cluster"]).mode == "tpu"


def test_sagemaker_mode() -> None:
    config = {"compute_environment": "AMAZON_SAGEMAKER", "ec2_instance_type": "ml.p3.2xlarge", "iam_role_name": "r"}
    assert plan_of([], config).mode == "sagemaker"


def test_repeatable_flags() -> None:
    plan = plan_of(["--tpu", "--env", "A=1", "--env", "B=2", "--vm", "v1"])
    assert plan.values["env"] == ["A=1", "B=2"] and plan.values["vm"] == ["v1"]


def test_sagemaker_job_arguments(tmp_path) -> None:
    from accel_launch.sagemaker import sagemaker_job_args

    metrics = tmp_path / "metrics.tsv"
    metrics.write_text("metric_name\tmetric_regex\naccuracy\tacc: ([0-9.]+)\n")
    config = config_from_dict(
        {
            "compute_environment": "AMAZON_SAGEMAKER",
            "distributed_type": "DATA_PARALLEL",
            "ec2_instance_type": "ml.p3.16xlarge",
            "iam_role_name": "role",
            "num_machines": 2,
            "mixed_precision": "fp16",
            "sagemaker_metrics_file": str(metrics),
            "additional_args": {"use_spot_instances": True, "max_wait": 86400},
        }
    )
    args = launch_command_parser().parse_args([str(tmp_path / "train.py"), "--epochs", "3", "--fast", "--lr=0.1"])
    plan = resolve(given_flags(args), config, CPU, args.training_script, args.training_script_args)
    kwargs, inputs = sagemaker_job_args(config, plan)
    assert kwargs["entry_point"] == "train.py" and kwargs["instance_count"] == 2 and kwargs["role"] == "role"
    assert kwargs["hyperparameters"] == {"epochs": "3", "fast": True, "lr": "0.1"}
    assert kwargs["distribution"] == {"smdistributed": {"dataparallel": {"enabled": True}}}
    assert (
        kwargs["environment"]["ACCELERATE_MIXED_PRECISION"] == "fp16"
        and kwargs["environment"]["ACCELERATE_USE_SAGEMAKER"] == "true"
    )
    assert kwargs["metric_definitions"] == [{"Name": "accuracy", "Regex": "acc: ([0-9.]+)"}]
    assert kwargs["use_spot_instances"] is True and inputs is None
    bad = launch_command_parser().parse_args([str(tmp_path / "train.py"), "positional"])
    with pytest.raises(ConfigError, match="named hyper-parameters"):
        sagemaker_job_args(
            config, resolve(given_flags(bad), config, CPU, bad.training_script, bad.training_script_args)
        )


def test_tpu_pod_command() -> None:
    from accel_launch.commands.tpu import tpu_pod_launch_command

    config = {
        "distributed_type": "XLA",
        "tpu_name": "pod1",
        "tpu_zone": "europe-west4-a",
        "tpu_use_cluster": True,
        "tpu_use_sudo": True,
        "num_processes": 8,
    }
    plan = plan_of(["--env", "A=1"], config)
    assert plan.mode == "tpu_pod"
    cmd = tpu_pod_launch_command(plan)
    assert cmd[:7] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "pod1", "--zone"]
    remote = cmd[cmd.index("--command") + 1]
    assert remote.startswith("export A=1; sudo accel launch --tpu --no_tpu_cluster --num_processes 8")
    assert remote.endswith("train.py --lr 1") and cmd[-2:] == ["--worker", "all"]


def test_launch_utilities_from_namespace() -> None:
    from accel_launch.launch_utils import (
        prepare_deepspeed_cmd_env,
        prepare_multi_gpu_env,
        prepare_simple_launcher_cmd_env,
    )

    args = launch_command_parser().parse_args(["--cpu", "--mixed_precision", "bf16", "train.py", "--x"])
    cmd, env = prepare_simple_launcher_cmd_env(args)
    assert cmd[1:] == ["train.py", "--x"] and env["ACCELERATE_MIXED_PRECISION"] == "bf16" and "PATH" in env
    args = launch_command_parser().parse_args(
        ["--cpu", "--num_processes", "2", "--main_process_port", "2222", "train.py"]
    )
    assert "--master_port 2222" in prepare_multi_gpu_env(args)["ACCEL_TORCHRUN_ARGS"]
    args = launch_command_parser().parse_args(
        [
            "--cpu",
            "--use_deepspeed",
            "--num_machines",
            "2",
            "--num_processes",
            "2",
            "--main_process_ip",
            "h0",
            "train.py",
        ]
    )
    cmd, env = prepare_deepspeed_cmd_env(args)
    assert cmd[0] == "deepspeed" and env["ACCELERATE_USE_DEEPSPEED"] == "true"
