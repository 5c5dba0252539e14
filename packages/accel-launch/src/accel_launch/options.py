"""The one table of ``accel launch`` options: flag, type, group, config-file key and default.

Everything that knows about a launch option reads this table: the argument parser (``launch_args``),
the config-file schema (``config_args``) and the translation of a config plus flags into the
environment of the processes (``plan``). A key missing here is unknown everywhere, so the three never
disagree. Pure data; imports nothing heavy.
"""

from __future__ import annotations

from accel_state.enums import (
    MIXED_PRECISION_CHOICES,
    AmaxComputeAlgorithm,
    ContextParallelCommStrategy,
    FP8BackendType,
    FP8Format,
    MSAMPOptLevel,
)

_FP8_BACKENDS = tuple(b.lower() for b in FP8BackendType.list() if b != "NO")

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time: `accel --help` stays fast
    from typing import Any

# Value kinds. ``switch`` is a flag without value (store_true) holding a bool.
KINDS = ("switch", "bool", "bool_or_str", "int", "float", "str", "list", "int_or_auto", "float_or_auto", "bool_triple")

TOP = "top"  # the section of top-level config keys

SECTIONS = (
    "deepspeed_config",
    "fsdp_config",
    "megatron_lm_config",
    "fp8_config",
    "dynamo_config",
    "ipex_config",
    "mpirun_config",
    "parallelism_config",
)


class Option:
    """One launch option: its flag (``--dest``), value kind, help group and where a config file keeps it.

    A plain class rather than a dataclass: building the table must not import ``dataclasses``
    (and through it ``inspect``), so that ``accel --help`` stays fast.
    """

    __slots__ = ("append", "choices", "default", "dest", "group", "help", "key", "kind", "section", "short")

    def __init__(
        self,
        dest: str,
        kind: str,
        group: str,
        help: str,
        section: str | None = TOP,
        key: str | None = None,
        default: Any = None,
        choices: tuple[str, ...] | None = None,
        short: tuple[str, ...] = (),
        append: bool = False,
    ) -> None:
        if kind not in KINDS:
            raise ValueError(f"option {dest}: kind {kind!r} is not one of {KINDS}")
        if section is not None and section != TOP and section not in SECTIONS:
            raise ValueError(f"option {dest}: unknown config section {section!r}")
        self.dest, self.kind, self.group, self.help = dest, kind, group, help
        self.section, self.key, self.default, self.choices = section, key, default, choices
        self.short, self.append = short, append

    def __repr__(self) -> str:
        return f"Option({self.dest!r}, {self.kind!r}, section={self.section!r})"

    @property
    def config_key(self) -> str | None:
        """Key in the config file (``None``: flag only)."""
        if self.section is None:
            return None
        return self.key or self.dest


G_GENERAL = "General"
G_HARDWARE = "Hardware Selection Arguments"
G_RESOURCE = "Resource Selection Arguments"
G_PARADIGM = "Training Paradigm Arguments"
G_DISTRIBUTED = "Distributed GPU Arguments"
G_TPU = "TPU Arguments"
G_DEEPSPEED = "DeepSpeed Arguments"
G_FSDP = "Fully Sharded Data Parallelism Arguments"
G_MEGATRON = "Megatron-LM Arguments"
G_FP8 = "FP8 Arguments"
G_AWS = "AWS SageMaker Arguments"
G_MPI = "MPI Arguments"
G_PARALLELISM = "ParallelismConfig Arguments"

_O = Option

# fmt: off
OPTIONS: tuple[Option, ...] = (
    # general
    _O("config_file", "str", G_GENERAL, "Config file with the default values of this launch.", None),
    _O("quiet", "switch", G_GENERAL, "Show only the relevant traceback of a failing process.", None, short=("-q",)),
    _O("module", "switch", G_GENERAL, "Run the script as a module, like 'python -m'.", None, short=("-m",)),
    _O("no_python", "switch", G_GENERAL, "Run the script as an executable, without 'python' in front.", None),
    _O("debug", "switch", G_GENERAL, "Print the torch.distributed stack trace on failure; check collectives.", TOP, default=False),
    _O("dry_run", "switch", G_GENERAL, "Print the resolved launch plan (and where each value came from) without starting anything.", None),
    _O("json", "switch", G_GENERAL, "With --dry_run: print the plan as JSON.", None),
    # hardware
    _O("cpu", "switch", G_HARDWARE, "Run on the CPU even when an accelerator is present.", TOP, key="use_cpu", default=False),
    _O("multi_gpu", "switch", G_HARDWARE, "Launch a distributed GPU run.", None),
    _O("cpu_fallback", "switch", G_HARDWARE, "With --multi_gpu or --gpu_ids on a machine without GPU, join the CPU processes in one gloo group (accel's opt-in) instead of running each on its own as the documented launcher does.", None),
    _O("tpu", "switch", G_HARDWARE, "Launch a TPU run.", None),
    _O("ipex", "switch", G_HARDWARE, "Use Intel Extension for PyTorch (IPEX).", "ipex_config", default=False),
    # resources
    _O("mixed_precision", "str", G_RESOURCE, "Mixed precision mode.", TOP, default="no", choices=MIXED_PRECISION_CHOICES),
    _O("num_processes", "int", G_RESOURCE, "Total number of processes to launch (all machines together).", TOP),
    _O("num_machines", "int", G_RESOURCE, "Number of machines taking part.", TOP, default=1),
    _O("num_cpu_threads_per_process", "int", G_RESOURCE, "CPU threads per process (OMP_NUM_THREADS).", None),
    _O("enable_cpu_affinity", "switch", G_RESOURCE, "Pin each process to the CPU cores near its GPU.", TOP, default=False),
    _O("dynamo_backend", "str", G_RESOURCE, "torch.compile backend ('no' to disable).", "dynamo_config", default="no"),
    _O("dynamo_mode", "str", G_RESOURCE, "torch.compile mode.", "dynamo_config", default="default", choices=("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")),
    _O("dynamo_use_fullgraph", "switch", G_RESOURCE, "torch.compile with fullgraph=True.", "dynamo_config", default=False),
    _O("dynamo_use_dynamic", "switch", G_RESOURCE, "torch.compile with dynamic shapes.", "dynamo_config", default=False ),
    _O("dynamo_use_regional_compilation", "switch", G_RESOURCE, "Compile repeated blocks once.", "dynamo_config", default=False),
    # paradigm
    _O("use_deepspeed", "switch", G_PARADIGM, "Train with DeepSpeed.", None),
    _O("use_fsdp", "switch", G_PARADIGM, "Train with FullyShardedDataParallel.", None),
    _O("use_megatron_lm", "switch", G_PARADIGM, "Train with Megatron-LM.", None),
    _O("use_parallelism_config", "switch", G_PARADIGM, "Build a ParallelismConfig (tensor/context/data parallel sizes).", None),
    _O("use_xpu", "switch", G_PARADIGM, "Use the IPEX plugin on Intel XPU.", "ipex_config", default=False),
    # distributed
    _O("gpu_ids", "str", G_DISTRIBUTED, "Comma-separated ids of the GPUs of this machine to use ('all' for every one).", TOP),
    _O("same_network", "switch", G_DISTRIBUTED, "All machines are on the same local network.", TOP, default=False),
    _O("machine_rank", "int", G_DISTRIBUTED, "Rank of this machine.", TOP, default=0),
    _O("main_process_ip", "str", G_DISTRIBUTED, "IP address of the machine of rank 0.", TOP),
    _O("main_process_port", "int", G_DISTRIBUTED, "Port of the machine of rank 0.", TOP),
    _O("tee", "str", G_DISTRIBUTED, "Tee std streams into a log file and the console (0: none, 1: stdout, 2: stderr, 3: both).", None, default="0", short=("-t",)),
    _O("log_dir", "str", G_DISTRIBUTED, "Base directory of the log files written by torch.distributed.run.", None),
    _O("role", "str", G_DISTRIBUTED, "User-defined role of the workers.", None, default="default"),
    _O("rdzv_backend", "str", G_DISTRIBUTED, "Rendezvous method: 'static' or 'c10d'.", TOP, default="static"),
    _O("rdzv_conf", "str", G_DISTRIBUTED, "More rendezvous settings (<key1>=<value1>,<key2>=<value2>,...).", None, default=""),
    _O("max_restarts", "int", G_DISTRIBUTED, "Worker group restarts before failing.", None, default=0),
    _O("monitor_interval", "float", G_DISTRIBUTED, "Seconds between checks of the workers' state.", None, default=0.1),
    _O("requeue_on_preemption", "switch", G_DISTRIBUTED, "In a SLURM job: after the workers stopped on SIGTERM/SIGUSR1 (and saved, with save_on_preemption), requeue the job with `scontrol requeue $SLURM_JOB_ID`.", None),
    # TPU
    _O("tpu_cluster", "switch", G_TPU, "Use a GCP TPU pod.", TOP, key="tpu_use_cluster", default=False),
    _O("no_tpu_cluster", "switch", G_TPU, "Do not use a TPU pod even if the config says so.", None),
    _O("tpu_use_sudo", "switch", G_TPU, "Run the script with sudo on each pod.", TOP, default=False),
    _O("vm", "list", G_TPU, "Compute VM instance names of a TPU pod (repeatable).", TOP, key="tpu_vm", append=True),
    _O("env", "list", G_TPU, "Environment variables to set on the TPU pod VMs (repeatable).", TOP, key="tpu_env", append=True),
    _O("main_training_function", "str", G_TPU, "Name of the main function of the script (TPU only).", TOP, default="main"),
    _O("downcast_bf16", "switch", G_TPU, "With bf16 on TPU, cast double tensors to bfloat16 too.", TOP, default=False),
    # DeepSpeed
    _O("deepspeed_config_file", "str", G_DEEPSPEED, "DeepSpeed JSON config file.", "deepspeed_config"),
    _O("zero_stage", "int", G_DEEPSPEED, "ZeRO optimization stage (0-3).", "deepspeed_config", default=2),
    _O("offload_optimizer_device", "str", G_DEEPSPEED, "Where to offload optimizer states (none|cpu|nvme).", "deepspeed_config", default="none"),
    _O("offload_param_device", "str", G_DEEPSPEED, "Where to offload parameters (none|cpu|nvme).", "deepspeed_config", default="none"),
    _O("offload_optimizer_nvme_path", "str", G_DEEPSPEED, "NVMe path for optimizer states.", "deepspeed_config", default="none"),
    _O("offload_param_nvme_path", "str", G_DEEPSPEED, "NVMe path for parameters.", "deepspeed_config", default="none"),
    _O("gradient_accumulation_steps", "int_or_auto", G_DEEPSPEED, "Gradient accumulation steps of the script.", "deepspeed_config"),
    _O("gradient_clipping", "float_or_auto", G_DEEPSPEED, "Gradient clipping value of the script.", "deepspeed_config"),
    _O("zero3_init_flag", "bool", G_DEEPSPEED, "Build huge models with deepspeed.zero.Init (ZeRO-3 only; true|false).", "deepspeed_config"),
    _O("zero3_save_16bit_model", "bool", G_DEEPSPEED, "Save 16-bit weights under ZeRO-3 (true|false).", "deepspeed_config"),
    _O("deepspeed_hostfile", "str", G_DEEPSPEED, "DeepSpeed hostfile of a multi-node run.", "deepspeed_config"),
    _O("deepspeed_exclusion_filter", "str", G_DEEPSPEED, "DeepSpeed exclusion filter of a multi-node run.", "deepspeed_config"),
    _O("deepspeed_inclusion_filter", "str", G_DEEPSPEED, "DeepSpeed inclusion filter of a multi-node run.", "deepspeed_config"),
    _O("deepspeed_multinode_launcher", "str", G_DEEPSPEED, "DeepSpeed multi-node launcher (pdsh, standard, openmpi, mvapich, mpich, slurm, nossh).", "deepspeed_config", default="pdsh"),
    _O("deepspeed_moe_layer_cls_names", "str", G_DEEPSPEED, "Comma-separated MoE layer class names to wrap.", "deepspeed_config"),
    # FSDP
    _O("fsdp_version", "int", G_FSDP, "FSDP version: 1 or 2.", "fsdp_config", default=1, choices=("1", "2")),
    _O("fsdp_offload_params", "bool", G_FSDP, "Offload parameters and gradients to CPU (true|false).", "fsdp_config", default=False),
    _O("fsdp_min_num_params", "int", G_FSDP, "Minimum parameters of a unit with SIZE_BASED_WRAP.", "fsdp_config", default=100000000),
    _O("fsdp_sharding_strategy", "str", G_FSDP, "FSDP1 sharding strategy (FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD, HYBRID_SHARD_ZERO2 or 1-5).", "fsdp_config", default="FULL_SHARD"),
    _O("fsdp_reshard_after_forward", "bool_or_str", G_FSDP, "FSDP2: reshard after forward (true|false); FSDP1: a sharding strategy.", "fsdp_config", default="true"),
    _O("fsdp_auto_wrap_policy", "str", G_FSDP, "Auto wrap policy (TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP, NO_WRAP).", "fsdp_config"),
    _O("fsdp_transformer_layer_cls_to_wrap", "str", G_FSDP, "Comma-separated layer class names to wrap, e.g. BertLayer.", "fsdp_config"),
    _O("fsdp_backward_prefetch", "str", G_FSDP, "Backward prefetch (BACKWARD_PRE, BACKWARD_POST, NO_PREFETCH).", "fsdp_config"),
    _O("fsdp_state_dict_type", "str", G_FSDP, "State dict type (FULL_STATE_DICT, LOCAL_STATE_DICT, SHARDED_STATE_DICT).", "fsdp_config"),
    _O("fsdp_forward_prefetch", "bool", G_FSDP, "Prefetch the next all-gather in forward (true|false).", "fsdp_config", default=False),
    _O("fsdp_use_orig_params", "bool", G_FSDP, "Allow non-uniform requires_grad in a unit (true|false).", "fsdp_config", default=True),
    _O("fsdp_cpu_ram_efficient_loading", "bool", G_FSDP, "Load the checkpoint on the first process only (true|false).", "fsdp_config", default=True),
    _O("fsdp_sync_module_states", "bool", G_FSDP, "Broadcast module states from rank 0 (true|false).", "fsdp_config", default=True),
    _O("fsdp_activation_checkpointing", "bool", G_FSDP, "Checkpoint activations of wrapped layers (true|false).", "fsdp_config", default=False),
    _O("fsdp_activation_checkpointing_offload", "bool", G_FSDP, "Offload checkpointed activations to the CPU (true|false).", "fsdp_config", default=False),
    _O("fsdp_ignored_modules", "str", G_FSDP, "Regular expression of module names FSDP leaves unsharded.", "fsdp_config"),
    # Megatron-LM
    _O("megatron_lm_tp_degree", "int", G_MEGATRON, "Tensor parallelism degree.", "megatron_lm_config", default=1),
    _O("megatron_lm_pp_degree", "int", G_MEGATRON, "Pipeline parallelism degree.", "megatron_lm_config", default=1),
    _O("megatron_lm_num_micro_batches", "int", G_MEGATRON, "Number of micro-batches when the PP degree > 1.", "megatron_lm_config"),
    _O("megatron_lm_sequence_parallelism", "bool", G_MEGATRON, "Sequence parallelism when the TP degree > 1 (true|false).", "megatron_lm_config"),
    _O("megatron_lm_recompute_activations", "bool", G_MEGATRON, "Selective activation recomputation (true|false).", "megatron_lm_config"),
    _O("megatron_lm_use_distributed_optimizer", "bool", G_MEGATRON, "Shard optimizer state and gradients across DP ranks (true|false).", "megatron_lm_config"),
    _O("megatron_lm_gradient_clipping", "float", G_MEGATRON, "Gradient clipping on the global L2 norm (0 disables).", "megatron_lm_config", default=1.0),
    _O("megatron_lm_use_custom_fsdp", "bool", G_MEGATRON, "Megatron's own FSDP implementation (true|false).", "megatron_lm_config"),
    _O("megatron_lm_no_load_optim", "bool", G_MEGATRON, "Do not load the optimizer state when resuming (true|false).", "megatron_lm_config"),
    _O("megatron_lm_eod_mask_loss", "bool", G_MEGATRON, "Mask the loss at end-of-document tokens (true|false).", "megatron_lm_config"),
    _O("megatron_lm_no_save_optim", "bool", G_MEGATRON, "Do not save the optimizer state (true|false).", "megatron_lm_config"),
    _O("megatron_lm_optimizer_cpu_offload", "bool", G_MEGATRON, "Keep the optimizer state on CPU (true|false).", "megatron_lm_config"),
    _O("megatron_lm_use_precision_aware_optimizer", "bool", G_MEGATRON, "Precision-aware optimizer (lower-precision states) (true|false).", "megatron_lm_config"),
    _O("megatron_lm_overlap_cpu_optimizer_d2h_h2d", "bool", G_MEGATRON, "Overlap device/host copies of a CPU-offloaded optimizer (true|false).", "megatron_lm_config"),
    _O("megatron_lm_decoder_last_pipeline_num_layers", "int", G_MEGATRON, "Decoder layers on the last pipeline stage.", "megatron_lm_config"),
    _O("megatron_lm_recompute_granularity", "str", G_MEGATRON, "Activation recomputation granularity (full or selective).", "megatron_lm_config"),
    _O("megatron_lm_recompute_method", "str", G_MEGATRON, "Activation recomputation method (uniform or block).", "megatron_lm_config"),
    _O("megatron_lm_recompute_num_layers", "int", G_MEGATRON, "Layers recomputed per stage or chunk.", "megatron_lm_config"),
    _O("megatron_lm_attention_backend", "str", G_MEGATRON, "Attention implementation Megatron-LM uses.", "megatron_lm_config"),
    _O("megatron_lm_expert_model_parallel_size", "int", G_MEGATRON, "Expert (MoE) model parallel size.", "megatron_lm_config"),
    _O("megatron_lm_context_parallel_size", "int", G_MEGATRON, "Context parallel size inside Megatron-LM.", "megatron_lm_config"),
    _O("megatron_lm_attention_dropout", "float", G_MEGATRON, "Dropout probability of attention.", "megatron_lm_config"),
    _O("megatron_lm_hidden_dropout", "float", G_MEGATRON, "Dropout probability of hidden states.", "megatron_lm_config"),
    _O("megatron_lm_attention_softmax_in_fp32", "bool", G_MEGATRON, "Compute the attention softmax in fp32 (true|false).", "megatron_lm_config"),
    _O("megatron_lm_expert_tensor_parallel_size", "int", G_MEGATRON, "Tensor parallel size of the experts.", "megatron_lm_config"),
    _O("megatron_lm_calculate_per_token_loss", "bool", G_MEGATRON, "Average the loss over tokens rather than micro-batches (true|false).", "megatron_lm_config"),
    _O("megatron_lm_use_rotary_position_embeddings", "bool", G_MEGATRON, "Rotary position embeddings (true|false).", "megatron_lm_config"),
    # FP8
    _O("fp8_backend", "str", G_FP8, "FP8 backend.", "fp8_config", key="backend", choices=_FP8_BACKENDS),
    _O("fp8_use_autocast_during_eval", "switch", G_FP8, "Keep FP8 autocast in evaluation (te).", "fp8_config", key="use_autocast_during_eval", default=False),
    _O("fp8_margin", "int", G_FP8, "Margin of the scaling factor (te).", "fp8_config", key="margin", default=0),
    _O("fp8_interval", "int", G_FP8, "Steps between scaling factor updates (te).", "fp8_config", key="interval", default=1),
    _O("fp8_format", "str", G_FP8, "FP8 format (te).", "fp8_config", default="HYBRID", choices=tuple(FP8Format.list())),
    _O("fp8_amax_history_len", "int", G_FP8, "Length of the amax history (te).", "fp8_config", key="amax_history_length", default=1024),
    _O("fp8_amax_compute_algo", "str", G_FP8, "Amax compute algorithm (te).", "fp8_config", key="amax_compute_algorithm", default="most_recent", choices=tuple(AmaxComputeAlgorithm.list())),
    _O("fp8_override_linear_precision", "bool_triple", G_FP8, "Run fprop, dgrad, wgrad GEMMs in higher precision, e.g. 'false,false,true' (te).", "fp8_config", key="override_linear_precision", default=(False, False, False)),
    _O("fp8_opt_level", "str", G_FP8, "MS-AMP optimisation level.", "fp8_config", key="opt_level", default="O2", choices=tuple(MSAMPOptLevel.list())),
    _O("fp8_enable_fsdp_float8_all_gather", "bool", G_FP8, "torchao: all-gather in float8 under FSDP2 (true|false).", "fp8_config", key="enable_fsdp_float8_all_gather", default=True),
    _O("fp8_pad_inner_dim", "bool", G_FP8, "torchao: pad inner dimensions (true|false).", "fp8_config", key="pad_inner_dim", default=True),
    # AWS
    _O("aws_access_key_id", "str", G_AWS, "AWS_ACCESS_KEY_ID of the SageMaker training job.", None),
    _O("aws_secret_access_key", "str", G_AWS, "AWS_SECRET_ACCESS_KEY of the SageMaker training job.", None),
    # MPI
    _O("mpirun_hostfile", "str", G_MPI, "Hostfile for mpirun (multi-CPU runs).", "mpirun_config"),
    _O("mpirun_ccl", "int", G_MPI, "Number of oneCCL worker threads with mpirun.", "mpirun_config", default=1),
    # ParallelismConfig
    _O("parallelism_config_dp_replicate_size", "int", G_PARALLELISM, "Data parallel replicate size.", "parallelism_config", default=1),
    _O("parallelism_config_dp_shard_size", "int", G_PARALLELISM, "Data parallel shard size.", "parallelism_config", default=1),
    _O("parallelism_config_tp_size", "int", G_PARALLELISM, "Tensor parallel size.", "parallelism_config", default=1),
    _O("parallelism_config_ep_size", "int", G_PARALLELISM, "Expert parallel size (accel extension): the processes each mixture-of-experts block's experts are split over.", "parallelism_config", default=1),
    _O("parallelism_config_cp_size", "int", G_PARALLELISM, "Context parallel size.", "parallelism_config", default=1),
    _O("parallelism_config_pp_size", "int", G_PARALLELISM, "Pipeline parallel size (accel extension).", "parallelism_config", default=1),
    _O("parallelism_config_cp_comm_strategy", "str", G_PARALLELISM, "Context parallel communication (allgather or alltoall).", "parallelism_config", default="allgather", choices=tuple(ContextParallelCommStrategy.list())),
    _O("parallelism_config_cp_backend", "str", G_PARALLELISM, "Context parallel backend.", "parallelism_config", default='torch', choices=('torch',)),
    _O("parallelism_config_sp_size", "int", G_PARALLELISM, "Sequence parallel size.", "parallelism_config", default=1),
    _O("parallelism_config_sp_backend", "str", G_PARALLELISM, "Sequence parallel backend.", "parallelism_config", default='deepspeed', choices=('deepspeed',)),
    _O("parallelism_config_sp_seq_length", "str", G_PARALLELISM, "Sequence length for sequence parallelism (a number, or left unset when variable).", "parallelism_config"),
    _O("parallelism_config_sp_seq_length_is_variable", "bool", G_PARALLELISM, "Sequence lengths vary between batches (true|false).", "parallelism_config", default=True),
    _O("parallelism_config_sp_attn_implementation", "str", G_PARALLELISM, "Attention implementation under sequence parallelism (e.g. sdpa, flash_attention_2).", "parallelism_config", default='sdpa'),
)
# fmt: on

#: Options by flag name (``dest``).
BY_DEST: dict[str, Option] = {opt.dest: opt for opt in OPTIONS}

#: Config keys that older files use for a key of the table (old name -> current option).
LEGACY_KEYS: dict[tuple[str, str], str] = {
    ("fsdp_config", "fsdp_backward_prefetch_policy"): "fsdp_backward_prefetch",
    ("fp8_config", "amax_history_len"): "fp8_amax_history_len",
    ("fp8_config", "amax_compute_algo"): "fp8_amax_compute_algo",
    ("fp8_config", "fp8_backend"): "fp8_backend",
    ("fp8_config", "fp8_opt_level"): "fp8_opt_level",
    ("fp8_config", "optimization_level"): "fp8_opt_level",
    ("fp8_config", "fp8_margin"): "fp8_margin",
    ("fp8_config", "fp8_interval"): "fp8_interval",
    ("fp8_config", "fp8_amax_history_len"): "fp8_amax_history_len",
    ("fp8_config", "fp8_amax_compute_algo"): "fp8_amax_compute_algo",
    ("fp8_config", "fp8_override_linear_precision"): "fp8_override_linear_precision",
    ("fp8_config", "fp8_use_autocast_during_eval"): "fp8_use_autocast_during_eval",
    (TOP, "dynamo_backend"): "dynamo_backend",
    (TOP, "ipex"): "ipex",
    (TOP, "use_xpu"): "use_xpu",
}


def section_options(section: str) -> dict[str, Option]:
    """Config key -> option, for the keys of one config section (``"top"`` for top-level keys)."""
    return {opt.config_key: opt for opt in OPTIONS if opt.section == section and opt.config_key}
