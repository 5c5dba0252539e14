"""From a config file plus flags to a launch plan: pure functions, tested in-process.

``resolve(flags, config, machine)`` merges the three sources (flags over file over defaults), checks
the result (conflicting paradigms, impossible process counts) and returns a `LaunchPlan`: how to
start the processes (``mode``) and the environment that carries the configuration to them, written
through ``accel_state.env_vars.encode``. Nothing here starts a process, reads a file or imports torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from accel_launch.ignored_settings import ignored_parallelism_settings
from accel_launch.options import BY_DEST, OPTIONS
from accel_launch.parallel_sizes import check_sizes, product_warning
from accel_launch.values import ConfigError, check_choice, coerce
from accel_state import env_vars
from accel_state.enums import (
    ComputeEnvironment,
    DistributedType,
    FSDPAutoWrapPolicy,
    FSDPBackwardPrefetch,
    FSDPShardingStrategy,
    FSDPStateDictType,
    OffloadDevice,
)

MODES = ("simple", "copies", "torchrun", "deepspeed", "mpirun", "tpu", "tpu_pod", "sagemaker")

_PARADIGMS = ("use_deepspeed", "use_fsdp", "use_megatron_lm")
_HARDWARE = ("cpu", "multi_gpu", "tpu", *_PARADIGMS)

#: distributed_type of a config file -> the flags that mean the same.
_TYPE_FLAGS: dict[DistributedType, dict[str, bool]] = {
    DistributedType.DEEPSPEED: {"use_deepspeed": True},
    DistributedType.FSDP: {"use_fsdp": True},
    DistributedType.MEGATRON_LM: {"use_megatron_lm": True},
    DistributedType.XLA: {"tpu": True},
    DistributedType.MULTI_CPU: {"cpu": True, "_multi": True},
}

_FSDP_STRATEGIES = tuple(FSDPShardingStrategy.list())
#: FSDP setting -> (its enum in accel_state, the variable that carries it).
_FSDP_CHOICES = {
    "fsdp_auto_wrap_policy": (FSDPAutoWrapPolicy, "FSDP_AUTO_WRAP_POLICY"),
    "fsdp_backward_prefetch": (FSDPBackwardPrefetch, "FSDP_BACKWARD_PREFETCH"),
    "fsdp_state_dict_type": (FSDPStateDictType, "FSDP_STATE_DICT_TYPE"),
}
_OFFLOAD = tuple(OffloadDevice.list())

#: Device type -> the variable that selects visible devices of that type.
VISIBLE_DEVICES_VAR = {
    "cuda": "CUDA_VISIBLE_DEVICES",
    "xpu": "ZE_AFFINITY_MASK",
    "npu": "ASCEND_RT_VISIBLE_DEVICES",
    "mlu": "MLU_VISIBLE_DEVICES",
    "musa": "MUSA_VISIBLE_DEVICES",
    "sdaa": "SDAA_VISIBLE_DEVICES",
    "hpu": "HABANA_VISIBLE_MODULES",
}


@dataclass(frozen=True)
class MachineInfo:
    """What this machine offers: accelerator type (``cpu`` when none), how many, CPU cores."""

    device: str = "cpu"
    num_devices: int = 0
    cpu_cores: int = 1

    @property
    def has_accelerator(self) -> bool:
        return self.device not in ("cpu", "mps") and self.num_devices > 0


@dataclass(frozen=True)
class LaunchPlan:
    """Everything needed to start the processes; ``env`` holds only the variables the launcher adds.

    Args:
        mode: How the processes are started (`simple`, `multi_gpu`, `deepspeed`, `xla`, `sagemaker`, ...).
        training_script: The script (or module) to run.
        training_script_args: Its arguments.
        num_processes: Total number of processes over all machines.
        num_machines: Number of machines.
        machine_rank: Rank of this machine.
        main_process_ip: Address of the machine of process 0.
        main_process_port: Port of the rendezvous.
        port_given: True when the port came from a flag or the config file (not picked by the launcher).
        values: Every launch option, resolved (flag over config file over default).
        env: The environment variables the launcher adds for the processes.
        notes: Messages for the user about choices made.
        sagemaker: True when the run is a SageMaker job.
        config_source: The config file used, if any.
        extra: Settings of the mode that are not launch options.
        defaulted_env: Variables of `env` whose value is only the launcher's default; a value the user
            exported wins.
        sources: Where each launch option's value came from (`flag --x`, `config file <path>`,
            `environment PET_NNODES`, `chosen by the launcher (...)` or `default`).
        warnings: Things the user should know about this launch (a flag that does nothing here, a
            fall-back taken).
        scheduler: The scheduler whose variables filled in the topology (`slurm`, `kubernetes`), if any.
    """

    mode: str
    training_script: str
    training_script_args: tuple[str, ...]
    num_processes: int
    num_machines: int
    machine_rank: int
    main_process_ip: str | None
    main_process_port: int | None
    port_given: bool
    values: Mapping[str, Any]
    env: Mapping[str, str]
    notes: tuple[str, ...] = ()
    sagemaker: bool = False
    config_source: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    #: Variables of ``env`` whose value is only the launcher's default (no flag, no config key set it):
    #: a value the user exported for them wins (see `accel_launch.runner.launch_env()`).
    defaulted_env: frozenset[str] = frozenset()
    #: Where each launch option's value came from: ``flag --x``, ``config file <path>``, ``environment
    #: PET_NNODES`` (a scheduler's variable), ``chosen by the launcher (...)`` or ``default``.
    sources: Mapping[str, str] = field(default_factory=dict)
    #: Things the user should know about this launch (a flag that does nothing here, a fall-back taken).
    warnings: tuple[str, ...] = ()
    #: The scheduler whose variables filled in the topology (``slurm``, ``kubernetes``), if any.
    scheduler: str | None = None

    @property
    def nproc_per_node(self) -> int:
        """Number of processes on each machine."""
        return self.num_processes // self.num_machines

    def __getattr__(self, name: str) -> Any:
        # plan.module, plan.debug, ...: the resolved value of any launch option.
        values = object.__getattribute__(self, "values")
        if name in values:
            return values[name]
        raise AttributeError(name)


def config_values(config: Any) -> dict[str, Any]:
    """The launch options a config file sets, by flag name (its ``distributed_type`` as paradigm flags)."""
    if config is None:
        return {}
    out: dict[str, Any] = {}
    for option in OPTIONS:
        key = option.config_key
        if key is None:
            continue
        if option.section == "top" or option.section is None:
            value = getattr(config, key, None)
        else:
            value = (getattr(config, option.section, None) or {}).get(key)
        if value is not None:
            out[option.dest] = value
    dtype = getattr(config, "distributed_type", None)
    if isinstance(dtype, DistributedType):
        if dtype in _TYPE_FLAGS:
            out.update(_TYPE_FLAGS[dtype])
        elif dtype.name.startswith("MULTI_"):
            # A multi-device type asks for devices, `use_cpu: true` beside it or not: the documented
            # launcher reads it so (the CPU choice only matters where no device exists, `_check_gpu_request`).
            out["multi_gpu"] = True
            out.pop("cpu", None)
    return out


def _check_flag_values(flags: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for dest, value in flags.items():
        option = BY_DEST[dest]
        where = f"--{dest}"
        if option.append:
            items: list[str] = []
            for item in value:
                items.extend(coerce("list", item, dest, where))
            out[dest] = items
            continue
        out[dest] = coerce(option.kind, value, dest, "command line")
    return out


#: Launch options a scheduler's variables may fill in (`accel_state.cluster.launch_topology()`).
TOPOLOGY_OPTIONS = ("num_machines", "machine_rank", "main_process_ip", "main_process_port")


def topology_values(topology: Any) -> dict[str, tuple[Any, str]]:
    """Launch option -> (value, source) from a `accel_state.cluster.LaunchTopology` (None: nothing)."""
    if topology is None or topology.fallback:
        return {}
    out: dict[str, tuple[Any, str]] = {}
    for name in TOPOLOGY_OPTIONS:
        value = getattr(topology, name)
        if value is not None:
            out[name] = (value, f"environment {topology.sources.get(name, topology.scheduler)}")
    machines, per_machine = topology.num_machines, topology.nproc_per_machine
    if per_machine is not None:
        source = topology.sources.get("nproc_per_machine", "")
        if machines is not None:
            source += f" x {topology.sources.get('num_machines', '')}"
        out["num_processes"] = (per_machine * (machines or 1), f"environment {source}")
    return out


def merge(
    flags: Mapping[str, Any], config: Any, cluster: Mapping[str, tuple[Any, str]] | None = None
) -> tuple[dict[str, Any], set[str]]:
    """Flags over a scheduler's variables over config over defaults; also returns the names whose value
    came from none of them. ``values["_sources"]`` says where each value came from."""
    flags = _check_flag_values(flags)
    from_config = config_values(config)
    cluster = cluster or {}
    if any(flags.get(name) for name in _HARDWARE):
        # A hardware or paradigm flag replaces the config's choice of hardware and paradigm
        # (distributed_type and use_cpu); its other keys still apply.
        for name in (*_HARDWARE, "_multi"):
            from_config.pop(name, None)
    where = f"config file {getattr(config, 'source', None) or ''}".strip()
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    defaulted: set[str] = set()
    for option in OPTIONS:
        if option.dest in flags:
            values[option.dest] = flags[option.dest]
            sources[option.dest] = f"flag --{option.dest}"
        elif option.dest in cluster:
            values[option.dest], sources[option.dest] = cluster[option.dest]
        elif option.dest in from_config:
            values[option.dest] = from_config[option.dest]
            sources[option.dest] = where
        else:
            values[option.dest] = option.default
            sources[option.dest] = "default"
            defaulted.add(option.dest)
    values["_multi"] = bool(from_config.get("_multi"))
    values["_sources"] = sources
    return values, defaulted


def _check_paradigms(values: Mapping[str, Any]) -> None:
    chosen = [name for name in _PARADIGMS if values.get(name)]
    if len(chosen) > 1:
        flags = " and ".join(f"--{name}" for name in chosen)
        raise ConfigError(f"{flags} cannot be combined: choose one training paradigm (DeepSpeed, FSDP or Megatron-LM)")
    if values.get("tpu") and (chosen or values.get("multi_gpu")):
        other = chosen[0] if chosen else "multi_gpu"
        raise ConfigError(f"--tpu cannot be combined with --{other}")
    if values.get("cpu") and values.get("multi_gpu"):
        raise ConfigError("--cpu cannot be combined with --multi_gpu: the one forces the CPU, the other asks for GPUs")


def _fsdp_choice(enum_type: Any, value: Any, name: str) -> str:
    """The member of ``enum_type`` for ``value`` (name or 1-based number), or a ConfigError naming ``name``."""
    try:
        return str(enum_type.parse(value))
    except ValueError:
        return check_choice(str(value).strip().upper(), tuple(enum_type.list()), name, "FSDP settings")


def _fsdp_strategy(value: Any) -> str:
    return _fsdp_choice(FSDPShardingStrategy, value, "fsdp_sharding_strategy")


def _num_processes(values: dict[str, Any], machine: MachineInfo, notes: list[str], defaulted: set[str]) -> int:
    num_machines = values["num_machines"] or 1
    if values["num_processes"] is not None:
        return values["num_processes"]
    if values.get("cpu") or not machine.has_accelerator:
        count = 1 * num_machines
        if values.get("_multi"):
            count = max(1, machine.cpu_cores // 2) * num_machines
        where = "the CPU" if values.get("cpu") else "the CPU (no GPU found)"
        notes.append(f"{count} process{'es' if count > 1 else ''} on {where}")
    else:
        count = machine.num_devices * num_machines
        if values.get("gpu_ids") and values["gpu_ids"] != "all":
            count = len([g for g in str(values["gpu_ids"]).split(",") if g.strip()]) * num_machines
        notes.append(f"{count} process{'es' if count > 1 else ''}, one per {machine.device.upper()} device")
    if "mixed_precision" in defaulted:
        notes.append("no mixed precision")
    return count


def resolve(
    flags: Mapping[str, Any],
    config: Any = None,
    machine: MachineInfo | None = None,
    training_script: str = "",
    training_script_args: tuple[str, ...] | list[str] = (),
    topology: Any = None,
    environ: Mapping[str, str] | None = None,
) -> LaunchPlan:
    """The launch plan for ``flags`` (given flags only), ``config`` (a loaded config or None) on ``machine``.

    Args:
        flags: the launch options given on the command line (see ``given_flags``).
        config: the loaded config file, or None.
        machine: what this machine offers (a CPU-only machine when None).
        training_script: the script (module, program) to run.
        training_script_args: its arguments.
        topology: what a scheduler says about the run (`accel_state.cluster.launch_topology()`):
            fills the machines, machine rank, rendezvous address and processes the flags leave open,
            over the config file.
        environ: the user's environment (none when None); only ``ACCELERATE_USE_CPU`` is read, as a
            choice of the CPU that lets ``--multi_gpu`` / ``--gpu_ids`` run there on a machine without GPU.

    Returns:
        The `LaunchPlan` (nothing started).

    Raises:
        ConfigError: values that cannot be used (the message names them and what would be right).
    """
    machine = machine or MachineInfo()
    sagemaker = (
        config is not None and getattr(config, "compute_environment", None) == ComputeEnvironment.AMAZON_SAGEMAKER
    )
    values, defaulted = merge(flags, config, topology_values(topology))
    sources: dict[str, str] = values.pop("_sources")
    warnings: list[str] = []
    if getattr(config, "parallelism_config", None) and not values.get("use_parallelism_config"):
        values["use_parallelism_config"] = True  # a file's parallelism_config section asks for it
    ignored = ignored_parallelism_settings(values, sources)
    if ignored:
        warnings.append(ignored)
    check_sizes(values, sources)
    _check_paradigms(values)
    notes: list[str] = []
    _check_gpu_request(values, machine, sources, warnings, lambda: _cpu_choice(config, environ or {}))
    if values.get("gradient_accumulation_steps") is not None and not values.get("use_deepspeed"):
        warnings.append(
            f"{_named('gradient_accumulation_steps', sources)} is a DeepSpeed setting: it fills "
            "`gradient_accumulation_steps` of the DeepSpeed config and does nothing without --use_deepspeed; "
            "set Accelerator(gradient_accumulation_steps=...) in the script instead"
        )

    if values["num_processes"] is not None and values["num_processes"] < 1:
        raise ConfigError(f"--num_processes must be at least 1, got {values['num_processes']}")
    num_machines = values["num_machines"] or 1
    if num_machines < 1:
        raise ConfigError(f"--num_machines must be at least 1, got {num_machines}")
    machine_rank = values["machine_rank"] or 0
    if not 0 <= machine_rank < num_machines:
        raise ConfigError(
            f"--machine_rank must be between 0 and {num_machines - 1} (--num_machines {num_machines}), got {machine_rank}"
        )
    num_processes = _num_processes(values, machine, notes, defaulted)
    if sources["num_processes"] == "default":
        sources["num_processes"] = f"chosen by the launcher ({notes[0]})" if notes else "default"
    if num_processes % num_machines:
        raise ConfigError(
            f"--num_processes {num_processes} is the total over all machines and must be a multiple of "
            f"--num_machines {num_machines}"
        )
    if num_machines > 1 and not values.get("main_process_ip") and getattr(topology, "fallback", False):
        # The plain MASTER_ADDR/MASTER_PORT (Kubeflow and most job runners export them).
        for name in ("main_process_ip", "main_process_port"):
            if getattr(topology, name) is not None and sources[name] in ("default",):
                values[name] = getattr(topology, name)
                sources[name] = f"environment {topology.sources[name]}"
    if num_machines > 1 and not values.get("main_process_ip") and not values.get("tpu") and not sagemaker:
        raise ConfigError("a run on several machines needs --main_process_ip (the address of the machine of rank 0)")
    port = values.get("main_process_port")
    if port is not None and not 0 <= port < 65536:
        raise ConfigError(f"--main_process_port must be a port number (1-65535), or 0 to pick a free one, got {port}")
    if port == 0 and num_machines > 1:
        raise ConfigError(
            "--main_process_port 0 picks a free port on this machine, which the other machines cannot know: "
            "give the port the main machine listens on (for example --main_process_port 29500)"
        )
    if values["max_restarts"] < 0:
        raise ConfigError(f"--max_restarts must be 0 or more, got {values['max_restarts']}")
    threads = values.get("num_cpu_threads_per_process")
    if threads is not None and threads < 1:
        raise ConfigError(f"--num_cpu_threads_per_process must be at least 1, got {threads}")
    if values["module"] and values["no_python"]:
        raise ConfigError("--module and --no_python cannot be combined: a module is run by python")

    if values.get("cpu") is False or values.get("cpu") is None:
        values["cpu"] = bool(values.get("cpu"))
    if not machine.has_accelerator and not values["cpu"] and not values.get("tpu"):
        values["cpu"] = True  # nothing else to run on

    sagemaker = (
        config is not None and getattr(config, "compute_environment", None) == ComputeEnvironment.AMAZON_SAGEMAKER
    )
    mode = _mode(values, num_processes, num_machines, sagemaker)
    mismatch = product_warning(values, num_processes, mode)
    if mismatch:
        warnings.append(mismatch)
    env = build_env(values, machine, num_processes // num_machines, mode, config)
    return LaunchPlan(
        mode=mode,
        training_script=training_script,
        training_script_args=tuple(training_script_args),
        num_processes=num_processes,
        num_machines=num_machines,
        machine_rank=machine_rank,
        main_process_ip=values.get("main_process_ip"),
        main_process_port=port,
        port_given=bool(port),  # 0 asks for a free port, as no port does
        values=values,
        env=env,
        notes=tuple(notes),
        sagemaker=sagemaker,
        config_source=getattr(config, "source", None),
        extra={
            "tpu_name": getattr(config, "tpu_name", None),
            "tpu_zone": getattr(config, "tpu_zone", None),
            "config": config,
        },
        defaulted_env=_defaulted_env(env, defaulted),
        sources=sources,
        warnings=tuple(warnings),
        scheduler=None if topology is None or topology.fallback else topology.scheduler,
    )


def _named(name: str, sources: Mapping[str, str]) -> str:
    """``--name`` for a flag, else ``name (where it came from)``."""
    source = sources.get(name, "default")
    return f"--{name}" if source.startswith("flag") else f"{name} ({source})"


def _cpu_choice(config: Any, environ: Mapping[str, str]) -> str | None:
    """Where the user chose the CPU outside the flags, or None: ``use_cpu: true`` in the config file
    (also when a hardware flag replaced the file's choice), or ``ACCELERATE_USE_CPU`` in the environment."""
    if config is not None and getattr(config, "use_cpu", False):
        where = getattr(config, "source", None)
        return f"config file {where} (use_cpu: true)" if where else "config file (use_cpu: true)"
    raw = environ.get("ACCELERATE_USE_CPU")
    if raw is None or not raw.strip():
        return None
    try:
        chosen = env_vars.read("ACCELERATE_USE_CPU", {"ACCELERATE_USE_CPU": raw})
    except ValueError:
        raise ConfigError(
            f"ACCELERATE_USE_CPU={raw!r} in the environment is not a boolean: set it to true or false, or unset it"
        ) from None
    return "environment ACCELERATE_USE_CPU" if chosen else None


def _check_gpu_request(
    values: dict[str, Any],
    machine: MachineInfo,
    sources: dict[str, str],
    out: list[str],
    cpu_choice: Callable[[], str | None] | None = None,
) -> None:
    """``--multi_gpu`` or ``--gpu_ids`` on a machine without an accelerator: always a run on the CPU.

    As the documented launcher does, the processes run each on its own (``values["_independent"]``: no
    process group, each one process 0 of 1), said in ``out`` — unless ``ACCELERATE_USE_CPU=true`` in the
    environment (their state then forms one gloo group, as it does there) or ``--cpu_fallback`` (the
    explicit opt-in to one gloo group). ``cpu_choice`` says where the user chose the CPU, if anywhere.
    """
    if machine.has_accelerator or values.get("cpu") or values.get("tpu"):
        return
    asked = [
        _named(name, sources)
        for name in ("multi_gpu", "gpu_ids")
        if values.get(name) and str(values[name]).strip().lower() != "all"
    ]
    if not asked:
        return
    chosen = cpu_choice() if cpu_choice is not None else None
    sources["cpu"] = chosen or (
        "flag --cpu_fallback" if values.get("cpu_fallback") else "chosen by the launcher (no GPU found)"
    )
    if values.get("cpu_fallback"):
        out.append(
            f"{' and '.join(asked)} asks for GPUs, but this machine has none: running on the CPU, the processes "
            "forming one gloo group (--cpu_fallback)"
        )
    elif chosen is None or not chosen.startswith("environment"):
        # The documented launcher's processes see no GPU and no ACCELERATE_USE_CPU: each stays undistributed.
        values["_independent"] = True
        out.append(
            f"{' and '.join(asked)} asks for GPUs, but this machine has none: each process runs on the CPU on its "
            "own (no process group, each is process 0 of 1), as Hugging Face Accelerate does; add --cpu_fallback "
            "for one gloo group over them, or use --cpu for one process"
        )
    values["multi_gpu"] = False
    values["gpu_ids"] = None
    values["cpu"] = True


#: Variables whose name does not say which launch option sets them.
_ENV_SOURCE = {"ACCELERATE_DEBUG_MODE": "debug", "FSDP_TRANSFORMER_CLS_TO_WRAP": "fsdp_transformer_layer_cls_to_wrap"}


def _defaulted_env(env: Mapping[str, str], defaulted: set[str]) -> frozenset[str]:
    """The variables of ``env`` set from a launch option that kept its default.

    A variable belongs to the option it is named after (``ACCELERATE_MIXED_PRECISION`` to
    ``mixed_precision``, ``FSDP_OFFLOAD_PARAMS`` to ``fsdp_offload_params``, ``ACCELERATE_USE_CPU`` to
    ``cpu``), or to the one `_ENV_SOURCE` names.
    """
    out = set()
    for key in env:
        source = _ENV_SOURCE.get(key)
        if source is not None:
            if source in defaulted:
                out.add(key)
            continue
        upper = key.upper()
        if any(upper == name.upper() or upper.endswith("_" + name.upper()) for name in defaulted):
            out.add(key)
    return frozenset(out)


def _mode(values: Mapping[str, Any], num_processes: int, num_machines: int, sagemaker: bool) -> str:
    if sagemaker:
        return "sagemaker"
    if values.get("tpu"):
        return "tpu_pod" if values.get("tpu_cluster") and not values.get("no_tpu_cluster") else "tpu"
    if values.get("use_deepspeed") and num_machines > 1 and values["deepspeed_multinode_launcher"] != "standard":
        return "deepspeed"
    if values.get("cpu") and values.get("mpirun_hostfile") and num_processes > 1:
        return "mpirun"
    if values.get("_independent"):
        return "copies" if num_processes > num_machines else "simple"
    paradigm = any(values.get(name) for name in _PARADIGMS)
    if num_processes > 1 or num_machines > 1 or paradigm or values.get("multi_gpu"):
        return "torchrun"
    return "simple"


def build_env(
    values: Mapping[str, Any], machine: MachineInfo, nproc_per_node: int, mode: str, config: Any = None
) -> dict[str, str]:
    """The variables the processes read (protocol variables through ``env_vars.encode``, plus thread and device ones)."""
    protocol: dict[str, Any] = {
        "ACCELERATE_MIXED_PRECISION": values["mixed_precision"],
        "ACCELERATE_USE_CPU": bool(values.get("cpu")),
        "ACCELERATE_DEBUG_MODE": bool(values.get("debug")),
    }
    if values.get("dynamo_backend") and str(values["dynamo_backend"]).lower() != "no":
        protocol.update(
            ACCELERATE_DYNAMO_BACKEND=str(values["dynamo_backend"]).upper(),
            ACCELERATE_DYNAMO_MODE=values["dynamo_mode"],
            ACCELERATE_DYNAMO_USE_FULLGRAPH=bool(values["dynamo_use_fullgraph"]),
            ACCELERATE_DYNAMO_USE_DYNAMIC=bool(values["dynamo_use_dynamic"]),
            ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION=bool(values["dynamo_use_regional_compilation"]),
        )
    if values.get("ipex"):
        protocol["ACCELERATE_USE_IPEX"] = True
    if values.get("use_xpu"):
        protocol["ACCELERATE_USE_XPU"] = True
    if values.get("enable_cpu_affinity"):
        protocol["ACCELERATE_CPU_AFFINITY"] = True
    if values.get("tpu"):
        protocol["ACCELERATE_USE_TPU"] = True
        protocol["ACCELERATE_DOWNCAST_BF16"] = bool(values.get("downcast_bf16"))
    if values["mixed_precision"] == "fp8" or values.get("fp8_backend"):
        protocol.update(_fp8_env(values))
    if values.get("use_deepspeed"):
        protocol.update(_deepspeed_env(values, config))
    if values.get("use_fsdp"):
        protocol.update(_fsdp_env(values))
        # Keys of the documented system's FSDP settings that _fsdp_env does not carry.
        if values.get("fsdp_activation_checkpointing_offload"):
            protocol["FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD"] = True
        if values.get("fsdp_ignored_modules"):
            protocol["FSDP_IGNORED_MODULES"] = values["fsdp_ignored_modules"]
    if values.get("use_megatron_lm"):
        protocol.update(_megatron_env(values))
    if values.get("use_parallelism_config"):
        protocol["ACCELERATE_USE_PARALLELISM_CONFIG"] = True
        for name in (
            "dp_replicate_size",
            "dp_shard_size",
            "tp_size",
            "ep_size",
            "cp_size",
            "cp_comm_strategy",
            "pp_size",
        ):
            protocol[f"PARALLELISM_CONFIG_{name.upper()}"] = values[f"parallelism_config_{name}"]
        for name in ("cp_backend", "sp_size", "sp_backend"):
            protocol[f"PARALLELISM_CONFIG_{name.upper()}"] = values.get(f"parallelism_config_{name}")
        if (values.get("parallelism_config_sp_size") or 1) > 1:
            for name in ("sp_seq_length", "sp_seq_length_is_variable", "sp_attn_implementation"):
                protocol[f"PARALLELISM_CONFIG_{name.upper()}"] = values.get(f"parallelism_config_{name}")
    env = env_vars.encode(protocol)

    threads = values.get("num_cpu_threads_per_process")
    if threads is None and values.get("cpu") and mode in ("torchrun", "mpirun", "copies"):
        threads = max(1, machine.cpu_cores // max(nproc_per_node, 1))
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    gpu_ids = values.get("gpu_ids")
    if gpu_ids and str(gpu_ids) != "all" and not values.get("cpu"):
        env[VISIBLE_DEVICES_VAR.get(machine.device, "CUDA_VISIBLE_DEVICES")] = str(gpu_ids)
    if mode == "mpirun":
        env["CCL_WORKER_COUNT"] = str(values.get("mpirun_ccl") or 1)
    return env


def _fp8_env(values: Mapping[str, Any]) -> dict[str, Any]:
    env: dict[str, Any] = {
        "ACCELERATE_FP8_BACKEND": (values.get("fp8_backend") or "te").upper(),
        "ACCELERATE_FP8_FORMAT": values["fp8_format"],
        "ACCELERATE_FP8_AMAX_HISTORY_LEN": values["fp8_amax_history_len"],
        "ACCELERATE_FP8_AMAX_COMPUTE_ALGO": values["fp8_amax_compute_algo"],
        "ACCELERATE_FP8_MARGIN": values["fp8_margin"],
        "ACCELERATE_FP8_INTERVAL": values["fp8_interval"],
        "ACCELERATE_FP8_OVERRIDE_LINEAR_PRECISION": [
            str(bool(v)).lower() for v in values["fp8_override_linear_precision"]
        ],
        "ACCELERATE_FP8_OPT_LEVEL": values["fp8_opt_level"],
        "ACCELERATE_FP8_USE_AUTOCAST_DURING_EVAL": bool(values["fp8_use_autocast_during_eval"]),
        "ACCELERATE_FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER": bool(values["fp8_enable_fsdp_float8_all_gather"]),
        "ACCELERATE_FP8_PAD_INNER_DIM": bool(values["fp8_pad_inner_dim"]),
    }
    return env


def _deepspeed_env(values: Mapping[str, Any], config: Any) -> dict[str, Any]:
    stage = values["zero_stage"]
    if stage not in (0, 1, 2, 3):
        raise ConfigError(f"--zero_stage must be 0, 1, 2 or 3, got {stage}")
    for name in ("offload_optimizer_device", "offload_param_device"):
        check_choice(str(values[name]).lower(), _OFFLOAD, name, "DeepSpeed settings")
    env: dict[str, Any] = {
        "ACCELERATE_USE_DEEPSPEED": True,
        "ACCELERATE_DEEPSPEED_ZERO_STAGE": stage,
        "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE": str(values["offload_optimizer_device"]).lower(),
        "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE": str(values["offload_param_device"]).lower(),
        "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_NVME_PATH": values["offload_optimizer_nvme_path"],
        "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_NVME_PATH": values["offload_param_nvme_path"],
        "ACCELERATE_DEEPSPEED_CONFIG_FILE": values.get("deepspeed_config_file"),
        "ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES": values.get("deepspeed_moe_layer_cls_names"),
    }
    if values.get("zero3_init_flag") is not None:
        env["ACCELERATE_DEEPSPEED_ZERO3_INIT"] = bool(values["zero3_init_flag"])
    if values.get("zero3_save_16bit_model") is not None:
        env["ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL"] = bool(values["zero3_save_16bit_model"])
    steps = values.get("gradient_accumulation_steps")
    if steps is not None and steps != "auto":
        env["ACCELERATE_GRADIENT_ACCUMULATION_STEPS"] = steps
    clipping = values.get("gradient_clipping")
    if clipping is not None and clipping != "auto":
        env["ACCELERATE_GRADIENT_CLIPPING"] = clipping
    ds_config = getattr(config, "deepspeed_config", None) or {}
    if ds_config:
        # Keys set in the config file: the process checks them against a DeepSpeed JSON file.
        fields = sorted(ds_config)
        if getattr(config, "mixed_precision", "no") != "no":
            fields.append("mixed_precision")
        env["ACCELERATE_CONFIG_DS_FIELDS"] = fields
    return env


def _fsdp_env(values: Mapping[str, Any]) -> dict[str, Any]:
    version = int(values["fsdp_version"])
    if version not in (1, 2):
        raise ConfigError(f"--fsdp_version must be 1 or 2, got {version}")
    env: dict[str, Any] = {
        "ACCELERATE_USE_FSDP": True,
        "FSDP_VERSION": version,
        "FSDP_OFFLOAD_PARAMS": bool(values["fsdp_offload_params"]),
        "FSDP_MIN_NUM_PARAMS": values["fsdp_min_num_params"],
        "FSDP_USE_ORIG_PARAMS": bool(values["fsdp_use_orig_params"]),
        "FSDP_CPU_RAM_EFFICIENT_LOADING": bool(values["fsdp_cpu_ram_efficient_loading"]),
        "FSDP_SYNC_MODULE_STATES": bool(values["fsdp_sync_module_states"])
        or bool(values["fsdp_cpu_ram_efficient_loading"]),
        "FSDP_FORWARD_PREFETCH": bool(values["fsdp_forward_prefetch"]),
        "FSDP_ACTIVATION_CHECKPOINTING": bool(values["fsdp_activation_checkpointing"]),
    }
    if version == 1:
        strategy = values["fsdp_sharding_strategy"]
        reshard = values.get("fsdp_reshard_after_forward")
        if isinstance(reshard, str) and reshard.upper() in _FSDP_STRATEGIES:
            strategy = reshard  # newer files keep the FSDP1 strategy under this key
        env["FSDP_SHARDING_STRATEGY"] = _fsdp_strategy(strategy)
    else:
        coerce("bool", values["fsdp_reshard_after_forward"], "fsdp_reshard_after_forward", "FSDP2 settings")
        env["FSDP_RESHARD_AFTER_FORWARD"] = str(coerce("bool", values["fsdp_reshard_after_forward"], "", "")).lower()
    for name, (enum_type, env_name) in _FSDP_CHOICES.items():
        value = values.get(name)
        if value is not None:
            env[env_name] = _fsdp_choice(enum_type, value, name)
    if values.get("fsdp_transformer_layer_cls_to_wrap"):
        env["FSDP_TRANSFORMER_CLS_TO_WRAP"] = values["fsdp_transformer_layer_cls_to_wrap"]
    return env


def _megatron_env(values: Mapping[str, Any]) -> dict[str, Any]:
    env: dict[str, Any] = {
        "ACCELERATE_USE_MEGATRON_LM": True,
        "MEGATRON_LM_TP_DEGREE": values["megatron_lm_tp_degree"],
        "MEGATRON_LM_PP_DEGREE": values["megatron_lm_pp_degree"],
        "MEGATRON_LM_GRADIENT_CLIPPING": values["megatron_lm_gradient_clipping"],
        "MEGATRON_LM_NUM_MICRO_BATCHES": values.get("megatron_lm_num_micro_batches"),
    }
    for name in ("sequence_parallelism", "recompute_activations", "use_distributed_optimizer"):
        value = values.get(f"megatron_lm_{name}")
        if value is not None:
            env[f"MEGATRON_LM_{name.upper()}"] = bool(value)
    for name in MEGATRON_EXTENDED:  # the newer settings: passed on when set
        if values.get(f"megatron_lm_{name}") is not None:
            env[f"MEGATRON_LM_{name.upper()}"] = values[f"megatron_lm_{name}"]
    return env


MEGATRON_EXTENDED = (
    "use_custom_fsdp",
    "no_load_optim",
    "eod_mask_loss",
    "no_save_optim",
    "optimizer_cpu_offload",
    "use_precision_aware_optimizer",
    "overlap_cpu_optimizer_d2h_h2d",
    "decoder_last_pipeline_num_layers",
    "recompute_granularity",
    "recompute_method",
    "recompute_num_layers",
    "attention_backend",
    "expert_model_parallel_size",
    "context_parallel_size",
    "attention_dropout",
    "hidden_dropout",
    "attention_softmax_in_fp32",
    "expert_tensor_parallel_size",
    "calculate_per_token_loss",
    "use_rotary_position_embeddings",
)
