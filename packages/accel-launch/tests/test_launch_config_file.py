"""Config files: documented examples load unchanged, bad keys and types are clear errors, the default location."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import yaml

from accel_launch.commands.config.config_args import (
    ClusterConfig,
    SageMakerConfig,
    cache_dir,
    config_from_dict,
    default_config_path,
    load_config_from_file,
)
from accel_launch.values import ConfigError
from accel_state.enums import ComputeEnvironment, DistributedType, SageMakerDistributedType

FSDP_EXAMPLE = """\
compute_environment: LOCAL_MACHINE
debug: false
distributed_type: FSDP
downcast_bf16: 'no'
fsdp_config:
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_backward_prefetch_policy: BACKWARD_PRE
  fsdp_forward_prefetch: false
  fsdp_cpu_ram_efficient_loading: true
  fsdp_offload_params: false
  fsdp_sharding_strategy: FULL_SHARD
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_sync_module_states: true
  fsdp_transformer_layer_cls_to_wrap: BertLayer
  fsdp_use_orig_params: true
machine_rank: 0
main_training_function: main
mixed_precision: bf16
num_machines: 1
num_processes: 2
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: false
"""

DEEPSPEED_EXAMPLE = """\
command_file: null
commands: null
compute_environment: LOCAL_MACHINE
deepspeed_config:
  gradient_accumulation_steps: 1
  gradient_clipping: 1.0
  offload_optimizer_device: 'cpu'
  offload_param_device: 'cpu'
  zero3_init_flag: true
  zero3_save_16bit_model: true
  zero_stage: 3
  deepspeed_config_file: 'ds_config.json'
distributed_type: DEEPSPEED
downcast_bf16: 'no'
dynamo_backend: 'NO'
fsdp_config: {}
gpu_ids: null
machine_rank: 0
main_process_ip: null
main_process_port: null
main_training_function: main
megatron_lm_config: {}
num_machines: 1
num_processes: 2
rdzv_backend: static
same_network: true
tpu_name: null
tpu_zone: null
use_cpu: false
"""

MEGATRON_EXAMPLE = """\
compute_environment: LOCAL_MACHINE
deepspeed_config: {}
distributed_type: MEGATRON_LM
downcast_bf16: 'no'
fsdp_config: {}
machine_rank: 0
main_process_ip: null
main_process_port: null
main_training_function: main
megatron_lm_config:
  megatron_lm_gradient_clipping: 1.0
  megatron_lm_num_micro_batches: 2
  megatron_lm_pp_degree: 2
  megatron_lm_recompute_activations: true
  megatron_lm_sequence_parallelism: true
  megatron_lm_tp_degree: 2
  megatron_lm_use_distributed_optimizer: true
mixed_precision: bf16
num_machines: 1
num_processes: 4
rdzv_backend: static
same_network: true
use_cpu: false
"""

IPEX_MPI_EXAMPLE = """\
compute_environment: LOCAL_MACHINE
distributed_type: MULTI_CPU
downcast_bf16: 'no'
ipex_config:
  ipex: true
machine_rank: 0
main_process_ip: 36.112.23.24
main_process_port: 29500
main_training_function: main
mixed_precision: bf16
mpirun_config:
  mpirun_ccl: '1'
  mpirun_hostfile: /home/user/hostfile
num_machines: 4
num_processes: 16
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: true
"""

FP8_EXAMPLE = """\
mixed_precision: fp8
fp8_config:
  amax_compute_algorithm: max
  amax_history_length: 1024
  backend: TE
  fp8_format: HYBRID
  interval: 1
  margin: 0
  override_linear_precision: false
  use_autocast_during_eval: false
"""

SAGEMAKER_EXAMPLE = """\
base_job_name: accelerate-sagemaker-1
compute_environment: AMAZON_SAGEMAKER
distributed_type: DATA_PARALLEL
ec2_instance_type: ml.p3.16xlarge
iam_role_name: xxxxx
image_uri: null
mixed_precision: fp16
num_machines: 1
profile: xxxxx
py_version: py38
pytorch_version: 1.10.2
region: us-east-1
transformers_version: 4.17.0
use_cpu: false
additional_args:
  enable_network_isolation: True
  use_spot_instances: True
  max_wait: 86400
"""

TWO_GPU_EXAMPLE = """\
compute_environment: LOCAL_MACHINE
deepspeed_config: {}
distributed_type: MULTI_GPU
fsdp_config: {}
machine_rank: 0
main_process_ip: null
main_process_port: null
main_training_function: main
mixed_precision: fp16
num_machines: 1
num_processes: 2
use_cpu: false
"""


def _write(tmp_path: Path, text: str, name: str = "config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "text",
    [FSDP_EXAMPLE, DEEPSPEED_EXAMPLE, MEGATRON_EXAMPLE, IPEX_MPI_EXAMPLE, FP8_EXAMPLE, TWO_GPU_EXAMPLE],
    ids=["fsdp", "deepspeed", "megatron", "ipex-mpi", "fp8", "two-gpu"],
)
def test_documented_examples_load(tmp_path: Path, text: str) -> None:
    config = load_config_from_file(_write(tmp_path, text))
    assert isinstance(config, ClusterConfig)
    assert config.compute_environment == ComputeEnvironment.LOCAL_MACHINE


def test_fsdp_example_values(tmp_path: Path) -> None:
    config = load_config_from_file(_write(tmp_path, FSDP_EXAMPLE))
    assert config.distributed_type == DistributedType.FSDP
    assert config.num_processes == 2 and config.mixed_precision == "bf16"
    assert config.downcast_bf16 is False  # the documented file writes the string 'no'
    # the older key name is read as the current one
    assert config.fsdp_config["fsdp_backward_prefetch"] == "BACKWARD_PRE"
    assert config.fsdp_config["fsdp_transformer_layer_cls_to_wrap"] == "BertLayer"


def test_deepspeed_example_moves_old_dynamo_key(tmp_path: Path) -> None:
    config = load_config_from_file(_write(tmp_path, DEEPSPEED_EXAMPLE))
    assert config.distributed_type == DistributedType.DEEPSPEED
    assert config.deepspeed_config["zero_stage"] == 3
    assert config.dynamo_config == {"dynamo_backend": "NO"}


def test_fp8_backend_lowercased_and_triple(tmp_path: Path) -> None:
    config = load_config_from_file(_write(tmp_path, FP8_EXAMPLE))
    assert config.fp8_config["backend"] == "te"
    assert config.fp8_config["override_linear_precision"] == (False, False, False)


def test_sagemaker_example(tmp_path: Path) -> None:
    config = load_config_from_file(_write(tmp_path, SAGEMAKER_EXAMPLE))
    assert isinstance(config, SageMakerConfig)
    assert config.distributed_type == SageMakerDistributedType.DATA_PARALLEL
    assert config.additional_args["max_wait"] == 86400


def test_sagemaker_missing_required_key(tmp_path: Path) -> None:
    text = SAGEMAKER_EXAMPLE.replace("iam_role_name: xxxxx\n", "")
    with pytest.raises(ConfigError, match="iam_role_name"):
        load_config_from_file(_write(tmp_path, text))


def test_unknown_key_names_it_and_closest(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config_from_file(_write(tmp_path, TWO_GPU_EXAMPLE.replace("num_processes:", "num_process:")))
    message = str(info.value)
    assert "'num_process'" in message and "did you mean 'num_processes'" in message
    assert str(tmp_path) in message


def test_unknown_nested_key_names_section(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config_from_file(_write(tmp_path, FSDP_EXAMPLE.replace("fsdp_offload_params", "fsdp_ofload_params")))
    assert "fsdp_config" in str(info.value) and "did you mean 'fsdp_offload_params'" in str(info.value)


@pytest.mark.parametrize(
    ("old", "new", "key", "expected"),
    [
        ("num_processes: 2", "num_processes: two", "num_processes", "an integer"),
        ("use_cpu: false", "use_cpu: maybe", "use_cpu", "a boolean"),
        ("machine_rank: 0", "machine_rank: [0]", "machine_rank", "an integer"),
        ("main_training_function: main", "main_training_function: {a: 1}", "main_training_function", "a string"),
    ],
)
def test_wrong_type_names_key_and_type(tmp_path: Path, old: str, new: str, key: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config_from_file(_write(tmp_path, TWO_GPU_EXAMPLE.replace(old, new)))
    assert repr(key) in str(info.value) and expected in str(info.value)


def test_wrong_nested_type(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'zero_stage' must be an integer"):
        load_config_from_file(_write(tmp_path, DEEPSPEED_EXAMPLE.replace("zero_stage: 3", "zero_stage: high")))


def test_bad_enum_value(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="distributed_type.*MULTI_GPU"):
        load_config_from_file(_write(tmp_path, TWO_GPU_EXAMPLE.replace("MULTI_GPU", "MULTI_GPUS")))


def test_bare_yaml_no_values(tmp_path: Path) -> None:
    # YAML 1.1 reads bare `no` / `NO` as False: they still mean "no".
    config = load_config_from_file(_write(tmp_path, "distributed_type: NO\nmixed_precision: no\n"))
    assert config.distributed_type == DistributedType.NO and config.mixed_precision == "no"


def test_machine_rank_out_of_range(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="machine_rank"):
        load_config_from_file(_write(tmp_path, "num_machines: 2\nmachine_rank: 2\n"))


def test_json_config_and_round_trip(tmp_path: Path) -> None:
    source = load_config_from_file(_write(tmp_path, FSDP_EXAMPLE))
    json_path = tmp_path / "c.json"
    source.to_json_file(json_path)
    assert json.loads(json_path.read_text())["distributed_type"] == "FSDP"
    again = load_config_from_file(json_path)
    assert again.to_dict() == source.to_dict()
    yaml_path = tmp_path / "c.yaml"
    again.to_yaml_file(yaml_path)
    assert yaml.safe_load(yaml_path.read_text()) == source.to_dict()


def test_default_location_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "hf" / "accelerate"
    monkeypatch.delenv("HF_HOME")
    assert cache_dir() == tmp_path / "xdg" / "huggingface" / "accelerate"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "huggingface" / "accelerate"


def test_default_file_yaml_then_json(config_home: Path) -> None:
    assert default_config_path() == config_home / "accelerate" / "default_config.yaml"
    with pytest.raises(FileNotFoundError, match="accel config"):
        load_config_from_file()
    config_from_dict({"num_processes": 3}).to_json_file(config_home / "accelerate" / "default_config.json")
    assert default_config_path().suffix == ".json"
    assert load_config_from_file().num_processes == 3


def test_missing_file_names_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        load_config_from_file(tmp_path / "nope.yaml")


def test_invalid_yaml_is_clear(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid YAML") as raised:
        load_config_from_file(_write(tmp_path, "a: [1, 2\n"))
    # also PyYAML's error, which the documented system lets through (issue 37), and picklable
    assert isinstance(raised.value, yaml.YAMLError)
    again = pickle.loads(pickle.dumps(raised.value))
    assert type(again) is type(raised.value) and str(again) == str(raised.value)
