"""The config file: where it lives, its dataclasses, loading and saving (YAML or JSON).

``ClusterConfig`` describes a run on machines you reach yourself (``compute_environment:
LOCAL_MACHINE``); ``SageMakerConfig`` a run on Amazon SageMaker. Both validate themselves in
``__post_init__``: an unknown or misspelt key is an error naming it and the closest valid key, a value
of the wrong type is an error naming the key and the expected type. Files written by the documented
system load unchanged (legacy spellings are translated). No torch import here.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from accel_launch.options import LEGACY_KEYS, SECTIONS, TOP, section_options
from accel_launch.values import ConfigError, check_choice, coerce, unknown_keys_error
from accel_state.enums import MIXED_PRECISION_CHOICES, ComputeEnvironment, DistributedType, SageMakerDistributedType

CONFIG_FILE_NAME = "default_config.yaml"


def cache_dir() -> Path:
    """Folder of the default config: ``$HF_HOME/accelerate``, else ``$XDG_CACHE_HOME/huggingface/accelerate``,
    else ``~/.cache/huggingface/accelerate`` (read from the environment at each call)."""
    hf_home = os.environ.get("HF_HOME")
    if hf_home:
        return Path(os.path.expanduser(hf_home)) / "accelerate"
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    return Path(os.path.expanduser(xdg)) / "huggingface" / "accelerate"


def default_yaml_config_path() -> Path:
    return cache_dir() / CONFIG_FILE_NAME


def default_json_config_path() -> Path:
    return cache_dir() / "default_config.json"


def default_config_path() -> Path:
    """The default config file: the YAML one, or the JSON one when only that exists."""
    yaml_path = default_yaml_config_path()
    json_path = default_json_config_path()
    if not yaml_path.is_file() and json_path.is_file():
        return json_path
    return yaml_path


def __getattr__(name: str) -> Any:
    # Documented module constants, computed when read so that HF_HOME changes are seen.
    if name == "hf_cache_home":
        return str(cache_dir().parent)
    if name == "cache_dir_path":
        return str(cache_dir())
    if name == "default_yaml_config_file":
        return str(default_yaml_config_path())
    if name == "default_json_config_file":
        return str(default_json_config_path())
    if name == "default_config_file":
        return str(default_config_path())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _where(source: str | None) -> str:
    return f"config file {source}" if source else "config"


def _check_section(section: str, values: Any, source: str | None) -> dict[str, Any]:
    """One nested section (``fsdp_config`` ...) with its keys checked, legacy names translated."""
    where = f"{_where(source)}, section {section!r}"
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ConfigError(f"{_where(source)}: {section!r} must be a mapping of keys to values, got {values!r}")
    known = section_options(section)
    unknown = [str(key) for key in values if (section, key) not in LEGACY_KEYS and key not in known]
    if unknown:
        raise unknown_keys_error(unknown, known, where)
    out: dict[str, Any] = {}
    for key, value in values.items():
        if (section, key) in LEGACY_KEYS:
            from accel_launch.options import BY_DEST

            key = BY_DEST[LEGACY_KEYS[(section, key)]].config_key
        option = known[key]
        kind = "bool" if option.kind == "switch" else option.kind
        value = coerce(kind, value, key, where)
        if section == "fp8_config" and key == "backend" and value is not None:
            value = value.lower()
        if option.choices is not None and kind in ("str", "int"):
            check_choice(str(value), option.choices, key, where)
        out[key] = value
    return out


_TOP_KINDS = {
    "mixed_precision": "str",
    "use_cpu": "bool",
    "debug": "bool",
    "num_processes": "int",
    "machine_rank": "int",
    "num_machines": "int",
    "gpu_ids": "str",
    "main_process_ip": "str",
    "main_process_port": "int",
    "rdzv_backend": "str",
    "same_network": "bool",
    "main_training_function": "str",
    "enable_cpu_affinity": "bool",
    "downcast_bf16": "bool",
    "tpu_name": "str",
    "tpu_zone": "str",
    "tpu_use_cluster": "bool",
    "tpu_use_sudo": "bool",
    "command_file": "str",
    "commands": "list",
    "tpu_vm": "list",
    "tpu_env": "list",
    "ec2_instance_type": "str",
    "iam_role_name": "str",
    "image_uri": "str",
    "profile": "str",
    "region": "str",
    "base_job_name": "str",
    "pytorch_version": "str",
    "transformers_version": "str",
    "py_version": "str",
    "sagemaker_inputs_file": "str",
    "sagemaker_metrics_file": "str",
    "additional_args": "dict",
}


@dataclass
class BaseConfig:
    """Keys common to every config file.

    Args:
        compute_environment: Where the run happens: `LOCAL_MACHINE` or `AMAZON_SAGEMAKER`.
        distributed_type: The kind of run (`NO`, `MULTI_GPU`, `MULTI_CPU`, `FSDP`, `DEEPSPEED`, `XLA`, ...).
        mixed_precision: `no`, `fp16`, `bf16` or `fp8`.
        use_cpu: Run on CPU even when an accelerator is present.
        debug: Check collectives across processes and print the torch.distributed stack trace on failure.
        source: Where the config was read from (a file path), named in error messages.
    """

    compute_environment: ComputeEnvironment = ComputeEnvironment.LOCAL_MACHINE
    distributed_type: DistributedType | SageMakerDistributedType = DistributedType.NO
    mixed_precision: str = "no"
    use_cpu: bool = False
    debug: bool = False
    source: str | None = field(default=None, repr=False, compare=False)

    def _check_common(self) -> None:
        where = _where(self.source)
        self.compute_environment = _parse_enum(
            ComputeEnvironment, self.compute_environment, "compute_environment", where
        )
        if self.mixed_precision is False or self.mixed_precision is None:  # YAML reads a bare `no` as False
            self.mixed_precision = "no"
        self.mixed_precision = check_choice(
            coerce("str", self.mixed_precision, "mixed_precision", where),
            MIXED_PRECISION_CHOICES,
            "mixed_precision",
            where,
        ).lower()
        for name, kind in _TOP_KINDS.items():
            if hasattr(self, name) and name != "mixed_precision":
                setattr(self, name, coerce(kind, getattr(self, name), name, where))
        for section in SECTIONS:
            if hasattr(self, section):
                setattr(self, section, _check_section(section, getattr(self, section), self.source))

    def to_dict(self) -> dict[str, Any]:
        """Plain values (enums as strings), the way they are written to a file; unset keys left out."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name == "source":
                continue
            value = getattr(self, f.name)
            if value is None or (isinstance(value, dict) and not value and f.name.endswith("_config")):
                continue  # unset keys and empty sections are left out
            if hasattr(value, "value"):
                value = value.value
            if isinstance(value, tuple):
                value = list(value)
            if isinstance(value, dict):
                value = {k: (list(v) if isinstance(v, tuple) else v) for k, v in value.items()}
            out[f.name] = value
        return out

    def to_yaml_file(self, yaml_file: str | os.PathLike[str]) -> None:
        """Write the config as YAML (parent folders created).

        Args:
            yaml_file: Path of the YAML file.
        """
        import yaml

        path = Path(yaml_file)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(self.to_dict(), sort_keys=True))

    def to_json_file(self, json_file: str | os.PathLike[str]) -> None:
        """Write the config as JSON (parent folders created).

        Args:
            json_file: Path of the JSON file.
        """
        path = Path(json_file)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str | None = None) -> BaseConfig:
        """A config from a mapping; unknown keys are an error naming the closest valid one.

        Args:
            values: Config keys and their values.
            source: Where they come from (a file path), named in errors.
        """
        values = _translate_legacy(dict(values))
        valid = [f.name for f in fields(cls) if f.name != "source"]
        errors = []
        unknown = [str(key) for key in values if key not in valid]
        if unknown:
            errors.append(str(unknown_keys_error(unknown, valid, _where(source))))
        for section in SECTIONS:  # every unknown key of the file in one message, sections included
            inner = values.get(section) if section in valid else None
            if isinstance(inner, dict):
                known = section_options(section)
                wrong = [str(key) for key in inner if (section, key) not in LEGACY_KEYS and key not in known]
                if wrong:
                    errors.append(str(unknown_keys_error(wrong, known, f"{_where(source)}, section {section!r}")))
        if errors:
            raise ConfigError("; ".join(errors))
        missing = [f.name for f in fields(cls) if f.name in getattr(cls, "_required", ()) and f.name not in values]
        if missing:
            raise ConfigError(f"{_where(source)}: missing required key(s) {', '.join(missing)}")
        return cls(**values, source=source)

    @classmethod
    def from_yaml_file(cls, yaml_file: str | os.PathLike[str]) -> BaseConfig:
        """A config read from a YAML file; unknown keys are an error naming the closest valid one.

        Args:
            yaml_file: Path of the YAML file.
        """
        return cls.from_dict(_read_yaml(Path(yaml_file)), source=str(yaml_file))

    @classmethod
    def from_json_file(cls, json_file: str | os.PathLike[str]) -> BaseConfig:
        """A config read from a JSON file; unknown keys are an error naming the closest valid one.

        Args:
            json_file: Path of the JSON file.
        """
        return cls.from_dict(_read_json(Path(json_file)), source=str(json_file))


def _parse_enum(enum_cls: Any, value: Any, key: str, where: str) -> Any:
    if value is False:  # YAML reads a bare `NO` as False
        value = "NO"
    try:
        return enum_cls.parse(value)
    except ValueError:
        raise ConfigError(f"{where}: {key!r} must be one of {', '.join(enum_cls.list())}; got {value!r}") from None


def _translate_legacy(values: dict[str, Any]) -> dict[str, Any]:
    """Old spellings written by earlier releases of the documented system, moved to current keys."""
    if "fp16" in values and "mixed_precision" not in values:
        values["mixed_precision"] = "fp16" if values.pop("fp16") else "no"
    values.pop("fp16", None)
    if "dynamo_backend" in values:
        dynamo = dict(values.get("dynamo_config") or {})
        dynamo.setdefault("dynamo_backend", values.pop("dynamo_backend"))
        values["dynamo_config"] = dynamo
    for key in ("ipex", "use_xpu"):
        if key in values:
            ipex = dict(values.get("ipex_config") or {})
            ipex.setdefault(key, values.pop(key))
            values["ipex_config"] = ipex
    if values.get("distributed_type") == "TPU":
        values["distributed_type"] = "XLA"
    values.pop("use_mps_device", None)  # old key; the device is now detected
    return values


@dataclass
class ClusterConfig(BaseConfig):
    """A run on machines you start yourself (``compute_environment: LOCAL_MACHINE``).

    Args:
        compute_environment: Where the run happens: `LOCAL_MACHINE` or `AMAZON_SAGEMAKER`.
        distributed_type: The kind of run (`NO`, `MULTI_GPU`, `MULTI_CPU`, `FSDP`, `DEEPSPEED`, `XLA`, ...).
        mixed_precision: `no`, `fp16`, `bf16` or `fp8`.
        use_cpu: Run on CPU even when an accelerator is present.
        debug: Check collectives across processes and print the torch.distributed stack trace on failure.
        source: Where the config was read from (a file path), named in error messages.
        num_processes: Total number of processes to launch (all machines together).
        machine_rank: Rank of this machine.
        num_machines: Number of machines taking part.
        gpu_ids: Comma-separated ids of the GPUs of this machine to use ('all' for every one).
        main_process_ip: IP address of the machine of rank 0.
        main_process_port: Port of the machine of rank 0.
        rdzv_backend: Rendezvous method: 'static' or 'c10d'.
        same_network: All machines are on the same local network.
        main_training_function: Name of the main function of the script (TPU only).
        enable_cpu_affinity: Pin each process to the CPU cores near its GPU.
        downcast_bf16: With bf16 on TPU, cast double tensors to bfloat16 too.
        fp8_config: The `fp8_config` section (FP8 backend and recipe).
        deepspeed_config: The `deepspeed_config` section.
        fsdp_config: The `fsdp_config` section.
        megatron_lm_config: The `megatron_lm_config` section.
        dynamo_config: The `dynamo_config` section (`torch.compile` settings).
        ipex_config: The `ipex_config` section (Intel Extension for PyTorch).
        mpirun_config: The `mpirun_config` section (MPI launcher settings).
        parallelism_config: The `parallelism_config` section (ND mesh sizes).
        tpu_use_cluster: Use a GCP TPU pod.
        tpu_use_sudo: Run the script with sudo on each pod.
        tpu_vm: Compute VM instance names of a TPU pod (repeatable).
        tpu_env: Environment variables to set on the TPU pod VMs (repeatable).
        tpu_name: Name of the TPU (for `accel tpu-config`).
        tpu_zone: Zone of the TPU.
        command_file: File of commands `accel tpu-config` runs on each TPU host.
        commands: Commands `accel tpu-config` runs on each TPU host.
    """

    num_processes: int | None = None
    machine_rank: int = 0
    num_machines: int = 1
    gpu_ids: str | None = None
    main_process_ip: str | None = None
    main_process_port: int | None = None
    rdzv_backend: str | None = "static"
    same_network: bool | None = False
    main_training_function: str = "main"
    enable_cpu_affinity: bool = False
    downcast_bf16: bool = False
    fp8_config: dict | None = None
    deepspeed_config: dict | None = None
    fsdp_config: dict | None = None
    megatron_lm_config: dict | None = None
    dynamo_config: dict | None = None
    ipex_config: dict | None = None
    mpirun_config: dict | None = None
    parallelism_config: dict | None = None
    tpu_name: str | None = None
    tpu_zone: str | None = None
    tpu_use_cluster: bool = False
    tpu_use_sudo: bool = False
    command_file: str | None = None
    commands: list[str] | None = None
    tpu_vm: list[str] | None = None
    tpu_env: list[str] | None = None

    def __post_init__(self) -> None:
        where = _where(self.source)
        self.distributed_type = _parse_enum(DistributedType, self.distributed_type, "distributed_type", where)
        if self.gpu_ids is not None and not isinstance(self.gpu_ids, str):
            self.gpu_ids = (
                ",".join(str(i) for i in self.gpu_ids) if isinstance(self.gpu_ids, list) else str(self.gpu_ids)
            )
        self._check_common()
        if self.num_processes is not None and self.num_processes == -1:
            self.num_processes = None  # "-1": not set
        if self.num_processes is not None and self.num_processes < 1:
            raise ConfigError(f"{where}: 'num_processes' must be at least 1, got {self.num_processes}")
        if self.num_machines < 1:
            raise ConfigError(f"{where}: 'num_machines' must be at least 1, got {self.num_machines}")
        if not 0 <= self.machine_rank < self.num_machines:
            raise ConfigError(
                f"{where}: 'machine_rank' must be between 0 and num_machines - 1 = {self.num_machines - 1}, "
                f"got {self.machine_rank}"
            )
        if self.main_process_port is not None and not 0 < self.main_process_port < 65536:
            raise ConfigError(
                f"{where}: 'main_process_port' must be a port number (1-65535), got {self.main_process_port}"
            )


@dataclass
class SageMakerConfig(BaseConfig):
    """A training job on Amazon SageMaker (``compute_environment: AMAZON_SAGEMAKER``).

    Args:
        compute_environment: Where the run happens: `LOCAL_MACHINE` or `AMAZON_SAGEMAKER`.
        distributed_type: The kind of run (`NO`, `MULTI_GPU`, `MULTI_CPU`, `FSDP`, `DEEPSPEED`, `XLA`, ...).
        mixed_precision: `no`, `fp16`, `bf16` or `fp8`.
        use_cpu: Run on CPU even when an accelerator is present.
        debug: Check collectives across processes and print the torch.distributed stack trace on failure.
        source: Where the config was read from (a file path), named in error messages.
        num_machines: Number of machines taking part.
        gpu_ids: Comma-separated ids of the GPUs of this machine to use ('all' for every one).
        dynamo_config: The `dynamo_config` section (`torch.compile` settings).
        enable_cpu_affinity: Pin each process to the CPU cores near its GPU.
        ec2_instance_type: The EC2 instance type of the training job.
        iam_role_name: The IAM role the job runs as.
        image_uri: A custom training image; `None` uses the Hugging Face PyTorch image.
        profile: The AWS profile to use.
        region: The AWS region.
        base_job_name: Prefix of the job's name.
        pytorch_version: PyTorch version of the training image.
        transformers_version: transformers version of the training image.
        py_version: Python version tag of the training image.
        sagemaker_inputs_file: TSV file of input channels (name, S3 URI).
        sagemaker_metrics_file: TSV file of metric definitions (name, regex).
        additional_args: Extra keyword arguments of the SageMaker estimator.
    """

    _required = ("ec2_instance_type", "iam_role_name")

    ec2_instance_type: str = ""
    iam_role_name: str = ""
    image_uri: str | None = None
    profile: str | None = None
    region: str = "us-east-1"
    num_machines: int = 1
    gpu_ids: str = "all"
    base_job_name: str = "accel-sagemaker-1"
    pytorch_version: str | None = None
    transformers_version: str | None = None
    py_version: str | None = None
    sagemaker_inputs_file: str | None = None
    sagemaker_metrics_file: str | None = None
    additional_args: dict | None = None
    dynamo_config: dict | None = None
    enable_cpu_affinity: bool = False

    def __post_init__(self) -> None:
        where = _where(self.source)
        self.compute_environment = ComputeEnvironment.AMAZON_SAGEMAKER
        self.distributed_type = _parse_enum(SageMakerDistributedType, self.distributed_type, "distributed_type", where)
        self._check_common()
        if self.num_machines < 1:
            raise ConfigError(f"{where}: 'num_machines' must be at least 1, got {self.num_machines}")


_INVALID_YAML: list[type[ConfigError]] = []


def invalid_yaml_error() -> type[ConfigError]:
    """The class raised for a config file that is not valid YAML: a `ConfigError` (a ``ValueError``)
    that is also a ``yaml.YAMLError``, the type the documented system lets through, so that either
    ``except`` catches it. Built on first use: importing this module does not import yaml."""
    if not _INVALID_YAML:
        import yaml

        cls = type(
            "InvalidYAMLError",
            (ConfigError, yaml.YAMLError),
            {"__module__": __name__, "__doc__": "A config file that is not valid YAML (the message says where)."},
        )
        globals()["InvalidYAMLError"] = cls  # found by name, so that it pickles
        _INVALID_YAML.append(cls)
    return _INVALID_YAML[0]


def _read_yaml(path: Path) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise invalid_yaml_error()(f"config file {path} is not valid YAML: {error}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of keys to values, got {type(data).__name__}")
    return data


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ConfigError(f"config file {path} is not valid JSON: {error}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of keys to values, got {type(data).__name__}")
    return data


def config_from_dict(values: dict[str, Any], source: str | None = None) -> ClusterConfig | SageMakerConfig:
    """The right config class for ``values`` (by ``compute_environment``), validated."""
    env = values.get("compute_environment", "LOCAL_MACHINE")
    env = _parse_enum(ComputeEnvironment, env, "compute_environment", _where(source))
    cls = SageMakerConfig if env == ComputeEnvironment.AMAZON_SAGEMAKER else ClusterConfig
    return cls.from_dict(values, source=source)  # type: ignore[return-value]


def read_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The raw mapping of a YAML or JSON config file (JSON when the name ends in .json)."""
    path = Path(path)
    return _read_json(path) if path.suffix == ".json" else _read_yaml(path)


def load_config_from_file(config_file: str | os.PathLike[str] | None = None) -> ClusterConfig | SageMakerConfig:
    """Load ``config_file`` (or the default config file); FileNotFoundError naming the path when absent.

    Args:
        config_file: Path of the file; `None` reads the default config file.
    """
    if config_file is not None:
        path = Path(config_file)
        if not path.is_file():
            raise FileNotFoundError(
                f"the config file {path} does not exist; create it with `accel config --config_file {path}`"
            )
    else:
        path = default_config_path()
        if not path.is_file():
            raise FileNotFoundError(f"no default config file at {path}; create one with `accel config`")
    return config_from_dict(read_config_file(path), source=str(path))


def find_config_file(config_file: str | os.PathLike[str] | None) -> Path | None:
    """The config file a command should use: ``config_file`` if given (must exist), else the default if present."""
    if config_file is not None:
        path = Path(config_file)
        if not path.is_file():
            raise FileNotFoundError(f"the config file {path} does not exist")
        return path
    path = default_config_path()
    return path if path.is_file() else None


__all__ = [
    "TOP",
    "BaseConfig",
    "ClusterConfig",
    "ConfigError",
    "SageMakerConfig",
    "cache_dir",
    "config_from_dict",
    "default_config_path",
    "default_json_config_path",
    "default_yaml_config_path",
    "find_config_file",
    "load_config_from_file",
    "read_config_file",
]
