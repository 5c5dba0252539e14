"""The questions of ``accel config``, for this machine (``ClusterConfig``) or SageMaker (``SageMakerConfig``).

Only the questions that matter for the previous answers are asked; the answers become a validated
config object. Prompts are plain ``input()`` (see ``prompts``), so the questionnaire is tested through
a pseudo-terminal.
"""

from __future__ import annotations

from typing import Any

from accel_launch.commands.config.config_args import ClusterConfig, SageMakerConfig, config_from_dict
from accel_launch.commands.config.prompts import ask_bool, ask_choice, ask_float, ask_int, ask_text
from accel_state.enums import (
    MIXED_PRECISION_CHOICES,
    ContextParallelCommStrategy,
    DynamoBackend,
    FP8BackendType,
    FSDPAutoWrapPolicy,
    FSDPBackwardPrefetch,
    FSDPShardingStrategy,
    FSDPStateDictType,
    OffloadDevice,
)

# The question offers the sharded state dict first (the documented questionnaire's order).
_STATE_DICT_TYPES = [
    str(t)
    for t in (
        FSDPStateDictType.SHARDED_STATE_DICT,
        FSDPStateDictType.FULL_STATE_DICT,
        FSDPStateDictType.LOCAL_STATE_DICT,
    )
]
_FP8_BACKENDS = [b.lower() for b in FP8BackendType.list() if b != "NO"]

MACHINE_TYPES = [
    "No distributed training",
    "multi-CPU",
    "multi-GPU",
    "TPU",
    "multi-XPU",
    "multi-NPU",
    "multi-MLU",
    "multi-MUSA",
    "multi-HPU",
]
_MACHINE_VALUES = [
    "NO",
    "MULTI_CPU",
    "MULTI_GPU",
    "XLA",
    "MULTI_XPU",
    "MULTI_NPU",
    "MULTI_MLU",
    "MULTI_MUSA",
    "MULTI_HPU",
]
_DYNAMO = [backend.lower() for backend in DynamoBackend.list() if backend != DynamoBackend.NO]


def get_user_input() -> ClusterConfig | SageMakerConfig:
    """Ask where the run happens, then the questions of that place."""
    where = ask_choice(
        "In which compute environment are you running?", ["This machine", "AWS (Amazon SageMaker)"], [0, 1]
    )
    return get_sagemaker_input() if where == 1 else get_cluster_input()


def _dynamo_questions() -> dict[str, Any]:
    if not ask_bool("Do you wish to optimize your script with torch dynamo?", False):
        return {}
    backend = ask_choice("Which dynamo backend would you like to use?", _DYNAMO, default=2)
    dynamo: dict[str, Any] = {"dynamo_backend": backend.upper()}
    if ask_bool("Do you want to customize the defaults sent to torch.compile?", False):
        dynamo["dynamo_mode"] = ask_choice(
            "Which mode do you want to use?", ["default", "reduce-overhead", "max-autotune"]
        )
        dynamo["dynamo_use_fullgraph"] = ask_bool(
            "Do you want the fullgraph mode or it is ok to break model into several subgraphs?", False
        )
        dynamo["dynamo_use_dynamic"] = ask_bool("Do you want to enable dynamic shape tracing?", False)
        dynamo["dynamo_use_regional_compilation"] = ask_bool("Do you want to enable regional compilation?", False)
    return dynamo


def _deepspeed_questions(num_machines: int) -> dict[str, Any]:
    ds: dict[str, Any] = {}
    if ask_bool("Do you want to specify a json file to a DeepSpeed config?", False):
        ds["deepspeed_config_file"] = ask_text("Please enter the path to the json DeepSpeed config file")
    else:
        ds["zero_stage"] = ask_choice(
            "What should be your DeepSpeed's ZeRO optimization stage?", ["0", "1", "2", "3"], [0, 1, 2, 3], default=2
        )
        if ds["zero_stage"] >= 2:
            ds["offload_optimizer_device"] = ask_choice("Where to offload optimizer states?", OffloadDevice.list())
            if ds["offload_optimizer_device"] == "nvme":
                ds["offload_optimizer_nvme_path"] = ask_text("Nvme Path to offload optimizer states?", "/nvme")
        if ds["zero_stage"] == 3:
            ds["offload_param_device"] = ask_choice("Where to offload parameters?", OffloadDevice.list())
            if ds["offload_param_device"] == "nvme":
                ds["offload_param_nvme_path"] = ask_text("Nvme Path to offload parameters?", "/nvme")
        ds["gradient_accumulation_steps"] = ask_int(
            "How many gradient accumulation steps you're passing in your script?", 1, minimum=1
        )
        if ask_bool("Do you want to use gradient clipping?", False):
            ds["gradient_clipping"] = ask_float("What is the gradient clipping value?", 1.0)
        if ds["zero_stage"] == 3:
            ds["zero3_save_16bit_model"] = ask_bool(
                "Do you want to save 16-bit model weights when using ZeRO Stage-3?", False
            )
    if ds.get("zero_stage", 3) == 3:
        ds["zero3_init_flag"] = ask_bool(
            "Do you want to enable `deepspeed.zero.Init` when using ZeRO Stage-3 for constructing massive models?",
            False,
        )
    if ask_bool("Do you want to enable Mixture-of-Experts training (MoE)?", False):
        ds["deepspeed_moe_layer_cls_names"] = ask_text(
            "Specify the comma-separated list of transformers MoE layer class names (case-sensitive), e.g : `MixtralSparseMoeBlock`, `Qwen2MoeSparseMoeBlock`"
        )
    if num_machines > 1:
        launcher = ask_choice(
            "Which Type of launcher do you want to use?", ["pdsh", "standard", "openmpi", "mvapich", "mpich", "nossh"]
        )
        ds["deepspeed_multinode_launcher"] = launcher
        if launcher != "standard":
            ds["deepspeed_hostfile"] = ask_text(
                "DeepSpeed configures multi-node compute resources with hostfile. Please specify the location of hostfile"
            )
            if ask_bool("Do you want to specify exclusion filter string?", False):
                ds["deepspeed_exclusion_filter"] = ask_text("DeepSpeed exclusion filter string")
            if ask_bool("Do you want to specify inclusion filter string?", False):
                ds["deepspeed_inclusion_filter"] = ask_text("DeepSpeed inclusion filter string")
    return ds


def _fsdp_questions() -> dict[str, Any]:
    fsdp: dict[str, Any] = {}
    fsdp["fsdp_version"] = ask_choice("What should be your FSDP version?", ["1", "2"], [1, 2], default=0)
    if fsdp["fsdp_version"] == 1:
        fsdp["fsdp_sharding_strategy"] = ask_choice(
            "What should be your sharding strategy?",
            FSDPShardingStrategy.list(),
        )
    else:
        fsdp["fsdp_reshard_after_forward"] = ask_bool("Do you want to enable resharding after forward?", True)
    fsdp["fsdp_offload_params"] = ask_bool("Do you want to offload parameters and gradients to CPU?", False)
    policy = ask_choice("What should be your auto wrap policy?", FSDPAutoWrapPolicy.list())
    fsdp["fsdp_auto_wrap_policy"] = policy
    if policy == "TRANSFORMER_BASED_WRAP":
        if not ask_bool(
            "Do you want to use the model's `_no_split_modules` to wrap (only applicable for Transformers)?", True
        ):
            fsdp["fsdp_transformer_layer_cls_to_wrap"] = ask_text(
                "Specify the comma-separated list of transformer layer class names (case-sensitive) to wrap, e.g, `BertLayer`, `GPTJBlock`, `T5Block`"
            )
    elif policy == "SIZE_BASED_WRAP":
        fsdp["fsdp_min_num_params"] = ask_int(
            "What should be your FSDP's minimum number of parameters for Default Auto Wrapping?", 100000000, minimum=0
        )
    if fsdp["fsdp_version"] == 1:
        fsdp["fsdp_backward_prefetch"] = ask_choice(
            "What should be your FSDP's backward prefetch policy?", FSDPBackwardPrefetch.list()
        )
        fsdp["fsdp_forward_prefetch"] = ask_bool("Do you want to enable FSDP's forward prefetch policy?", False)
        fsdp["fsdp_use_orig_params"] = ask_bool("Do you want to enable FSDP's `use_orig_params` feature?", True)
    fsdp["fsdp_state_dict_type"] = ask_choice("What should be your FSDP's state dict type?", _STATE_DICT_TYPES)
    fsdp["fsdp_cpu_ram_efficient_loading"] = ask_bool(
        "Do you want each individually wrapped FSDP unit to broadcast module parameters from rank 0 at the start (CPU RAM efficient loading)?",
        True,
    )
    if fsdp["fsdp_version"] == 1:
        fsdp["fsdp_sync_module_states"] = (
            True
            if fsdp["fsdp_cpu_ram_efficient_loading"]
            else ask_bool("Do you want to broadcast module states from rank 0 (sync module states)?", True)
        )
    fsdp["fsdp_activation_checkpointing"] = ask_bool("Do you want to enable FSDP activation checkpointing?", False)
    return fsdp


def _megatron_questions() -> dict[str, Any]:
    mlm: dict[str, Any] = {
        "megatron_lm_tp_degree": ask_int("What is the Tensor Parallelism degree/size?", 1, minimum=1)
    }
    if mlm["megatron_lm_tp_degree"] > 1:
        mlm["megatron_lm_sequence_parallelism"] = ask_bool("Do you want to enable Sequence Parallelism?", True)
    mlm["megatron_lm_pp_degree"] = ask_int("What is the Pipeline Parallelism degree/size?", 1, minimum=1)
    if mlm["megatron_lm_pp_degree"] > 1:
        mlm["megatron_lm_num_micro_batches"] = ask_int("What is the number of micro-batches?", 1, minimum=1)
    mlm["megatron_lm_recompute_activations"] = ask_bool(
        "Do you want to enable selective activation recomputation?", True
    )
    mlm["megatron_lm_use_distributed_optimizer"] = ask_bool(
        "Do you want to use distributed optimizer which shards optimizer state and gradients across data parallel ranks?",
        True,
    )
    mlm["megatron_lm_gradient_clipping"] = ask_float(
        "What is the gradient clipping value based on global L2 Norm (0 to disable)?", 1.0
    )
    return mlm


def _parallelism_questions() -> dict[str, Any]:
    """The ``parallelism_config`` section: the mesh sizes, or nothing when the user wants none.

    Each size is one dimension of the processes' device mesh, so each is a whole number of at least 1;
    the context-parallel communication is asked only when that dimension is split.
    """
    if not ask_bool("Do you want to use ParallelismConfig (data, tensor, context and expert parallel sizes)?", False):
        return {}
    prefix = "parallelism_config_"
    section: dict[str, Any] = {
        f"{prefix}dp_replicate_size": ask_int("What is the data parallel replicate size?", 1, minimum=1),
        f"{prefix}dp_shard_size": ask_int("What is the data parallel shard (FSDP) size?", 1, minimum=1),
        f"{prefix}tp_size": ask_int("What is the tensor parallel size?", 1, minimum=1),
        f"{prefix}cp_size": ask_int("What is the context parallel size?", 1, minimum=1),
    }
    if section[f"{prefix}cp_size"] > 1:
        section[f"{prefix}cp_comm_strategy"] = ask_choice(
            "Which context parallel communication should be used?", ContextParallelCommStrategy.list()
        )
    section[f"{prefix}ep_size"] = ask_int(
        "What is the expert parallel size (the processes each mixture-of-experts block's experts are split over)?",
        1,
        minimum=1,
    )
    return section


def _mixed_precision(config: dict[str, Any]) -> None:
    precision = ask_choice("Do you wish to use mixed precision?", list(MIXED_PRECISION_CHOICES))
    config["mixed_precision"] = precision
    if precision == "fp8" and config.get("distributed_type") != "DEEPSPEED":
        backend = ask_choice("Which FP8 backend do you want to use?", _FP8_BACKENDS)
        fp8: dict[str, Any] = {"backend": backend}
        if backend == "te":
            fp8["fp8_format"] = ask_choice("Which weight format should be used?", ["HYBRID", "E4M3"])
            fp8["use_autocast_during_eval"] = ask_bool(
                "Should `fp8_autocast` be used during eval (if ran during training)?", False
            )
            fp8["margin"] = ask_int("What margin should be used for gradient scaling?", 0, minimum=0)
            fp8["interval"] = ask_int(
                "What interval should be used for for how often the scaling factor is recomputed?", 1, minimum=1
            )
            fp8["amax_history_length"] = ask_int(
                "What length of history should be used for the amax scaling factor computation?", 1024, minimum=1
            )
            fp8["amax_compute_algorithm"] = ask_choice(
                "Which algorithm should be used for the amax scaling factor computation?", ["max", "most_recent"]
            )
        elif backend == "msamp":
            fp8["opt_level"] = ask_choice("Which optimization level should be used?", ["O1", "O2"], default=1)
        config["fp8_config"] = fp8


def get_cluster_input() -> ClusterConfig:
    """The questions for a run on this machine or machines you start yourself."""
    config: dict[str, Any] = {"compute_environment": "LOCAL_MACHINE"}
    dtype = ask_choice("Which type of machine are you using?", MACHINE_TYPES, _MACHINE_VALUES)
    config["distributed_type"] = dtype
    multi = dtype.startswith("MULTI_")
    num_machines = 1
    if multi:
        num_machines = ask_int(
            "How many different machines will you use (use more than 1 for multi-node training)?", 1, minimum=1
        )
        if num_machines > 1:
            config["machine_rank"] = ask_int("What is the rank of this machine?", 0, minimum=0)
            config["main_process_ip"] = ask_text(
                "What is the IP address of the machine that will host the main process?"
            )
            config["main_process_port"] = ask_int(
                "What is the port you will use to communicate with the main process?", 29500, minimum=1
            )
            config["same_network"] = ask_bool(
                "Are all the machines on the same local network? Answer `no` if nodes are on the cloud and/or on different network hosts",
                True,
            )
            if not config["same_network"]:
                config["rdzv_backend"] = ask_text(
                    "What rendezvous backend will you use? ('static', 'c10d', ...)", "static"
                )
        config["debug"] = ask_bool(
            "Should distributed operations be checked while running for errors? This can avoid timeout issues but will be slower.",
            False,
        )
    config["num_machines"] = num_machines

    if dtype == "NO":
        config["use_cpu"] = ask_bool(
            "Do you want to run your training on CPU only (even if a GPU / Apple Silicon / Ascend NPU device is available)?",
            False,
        )
    elif dtype == "MULTI_CPU":
        config["use_cpu"] = True
    if (
        dtype in ("NO", "MULTI_CPU")
        and config.get("use_cpu")
        and ask_bool("Do you want to use Intel PyTorch Extension (IPEX) to speed up training on CPU?", False)
    ):
        config["ipex_config"] = {"ipex": True}
    if dtype == "MULTI_CPU" and ask_bool("Do you want accel to launch mpirun?", False):
        config["mpirun_config"] = {
            "mpirun_hostfile": ask_text("Please enter the path to the hostfile to use with mpirun", "~/hostfile"),
            "mpirun_ccl": ask_int("Enter the number of oneCCL worker threads", 1, minimum=1),
        }
    if dtype == "MULTI_XPU":
        config["ipex_config"] = {"use_xpu": True}
    if dtype != "XLA":
        dynamo = _dynamo_questions()
        if dynamo:
            config["dynamo_config"] = dynamo

    gpu_like = dtype not in ("NO", "MULTI_CPU", "XLA")
    if gpu_like:
        if ask_bool("Do you want to use DeepSpeed?", False):
            config["distributed_type"] = "DEEPSPEED"
            config["deepspeed_config"] = _deepspeed_questions(num_machines)
        elif ask_bool("Do you want to use FullyShardedDataParallel?", False):
            config["distributed_type"] = "FSDP"
            config["fsdp_config"] = _fsdp_questions()
            if config["fsdp_config"]["fsdp_version"] == 2:  # where, and when, the documented system asks
                parallelism = _parallelism_questions()
                if parallelism:
                    config["parallelism_config"] = parallelism
        elif dtype == "MULTI_GPU" and ask_bool("Do you want to use Megatron-LM ?", False):
            config["distributed_type"] = "MEGATRON_LM"
            config["megatron_lm_config"] = _megatron_questions()

    if dtype == "XLA":
        config["main_training_function"] = ask_text(
            "What is the name of the function in your script that should be launched in all parallel scripts?", "main"
        )
        config["tpu_use_cluster"] = ask_bool("Are you using a TPU cluster?", False)
        if config["tpu_use_cluster"]:
            config["tpu_name"] = ask_text("What is the name of your TPU?")
            config["tpu_zone"] = ask_text("What is the zone of your TPU?")
            config["tpu_use_sudo"] = ask_bool("To run a python script in a TPU pod, should `sudo` be used?", False)
            commands = ask_text(
                "What commands do you wish to run on startup in each pod (separated by ';', empty for none)?",
                allow_empty=True,
            )
            if commands:
                config["commands"] = [c.strip() for c in commands.split(";") if c.strip()]
        config["num_processes"] = ask_int("How many TPU cores should be used for distributed training?", 8, minimum=1)
    elif multi:
        what = "processes" if dtype == "MULTI_CPU" else f"{dtype.split('_', 1)[1]}(s)"
        config["num_processes"] = ask_int(f"How many {what} should be used for distributed training?", 1, minimum=1)
    else:
        config["num_processes"] = 1
    if gpu_like and multi:
        config["gpu_ids"] = ask_text(
            f"What {dtype.split('_', 1)[1]}(s) (by id) should be used for training on this machine as a comma-seperated list?",
            "all",
        )
        if dtype == "MULTI_GPU" and ask_bool(
            "Would you like to enable numa efficiency? (Currently only supported on NVIDIA hardware).", False
        ):
            config["enable_cpu_affinity"] = True

    _mixed_precision(config)
    if dtype == "XLA" and config["mixed_precision"] == "bf16":
        config["downcast_bf16"] = ask_bool(
            "Should `torch.float` be cast as `bfloat16` and `torch.double` remain `float32` on TPUs?", False
        )
    return config_from_dict(config)  # type: ignore[return-value]


def get_sagemaker_input() -> SageMakerConfig:
    """The questions for a training job on Amazon SageMaker (credentials are never saved)."""
    config: dict[str, Any] = {"compute_environment": "AMAZON_SAGEMAKER"}
    auth = ask_choice(
        "How do you want to authorize?",
        ["AWS Profile", "Credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)"],
        [0, 1],
    )
    if auth == 0:
        config["profile"] = ask_text("Enter your AWS Profile name", "default")
    config["region"] = ask_text("Enter your AWS Region", "us-east-1")
    config["iam_role_name"] = ask_text("Enter your IAM role name (it must exist and allow SageMaker)")
    if ask_bool("Do you want to use a custom Docker image?", False):
        config["image_uri"] = ask_text("Enter your Docker image")
    if ask_bool("Do you want to provide SageMaker input channels with data locations?", False):
        config["sagemaker_inputs_file"] = ask_text("Enter the path to the SageMaker inputs TSV file")
    if ask_bool("Do you want to enable SageMaker metrics?", False):
        config["sagemaker_metrics_file"] = ask_text("Enter the path to the SageMaker metrics TSV file")
    config["distributed_type"] = ask_choice(
        "What is the distributed mode?", ["No distributed training", "Data parallelism"], ["NO", "DATA_PARALLEL"]
    )
    dynamo = _dynamo_questions()
    if dynamo:
        config["dynamo_config"] = dynamo
    config["ec2_instance_type"] = ask_text(
        "Which EC2 instance type you want to use for your training?",
        "ml.p3.16xlarge" if config["distributed_type"] != "NO" else "ml.p3.2xlarge",
    )
    config["num_machines"] = (
        ask_int("How many machines do you want use?", 1, minimum=1) if config["distributed_type"] != "NO" else 1
    )
    config["mixed_precision"] = ask_choice("Do you wish to use mixed precision?", list(MIXED_PRECISION_CHOICES))
    return config_from_dict(config)  # type: ignore[return-value]
