"""``accel config`` answered through a pseudo-terminal, as a user would, producing the expected YAML."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import yaml


def _converse(
    args: list[str], dialogue: list[tuple[str, str]], env: dict[str, str], timeout: float = 30
) -> tuple[int, str]:
    """Run the command on a pseudo-terminal; for each (prompt text, answer) wait for the text, then type the answer."""
    master, slave = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "accel_launch.cli", *args],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env={**os.environ, **env},
        close_fds=True,
    )
    os.close(slave)
    transcript = ""
    deadline = time.monotonic() + timeout

    consumed = 0

    def read_until(text: str) -> None:
        nonlocal transcript
        while text not in transcript[consumed:]:
            if time.monotonic() > deadline:
                raise AssertionError(f"waited for {text!r}; the terminal shows:\n{transcript}")
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(master, 4096).decode()
                except OSError:
                    chunk = ""
                if not chunk and process.poll() is not None:
                    raise AssertionError(f"the command ended while waiting for {text!r}:\n{transcript}")
                transcript += chunk

    for prompt, answer in dialogue:
        read_until(prompt)
        consumed = transcript.index(prompt, consumed) + len(prompt)  # the next prompt comes after this one
        os.write(master, (answer + "\n").encode())
    read_until("configuration saved at")
    code = process.wait(timeout=timeout)
    os.close(master)
    return code, transcript


def test_fsdp_questionnaire_writes_expected_yaml(tmp_path: Path) -> None:
    target = tmp_path / "fsdp.yaml"
    dialogue = [
        ("In which compute environment are you running? ([0] This machine, [1] AWS (Amazon SageMaker)): ", "0"),
        ("Which type of machine are you using?", "2"),
        ("How many different machines will you use (use more than 1 for multi-node training)? [1]: ", ""),
        ("Should distributed operations be checked", "no"),
        ("Do you wish to optimize your script with torch dynamo? [yes/NO]: ", ""),
        ("Do you want to use DeepSpeed? [yes/NO]: ", "no"),
        ("Do you want to use FullyShardedDataParallel? [yes/NO]: ", "yes"),
        ("What should be your FSDP version?", ""),
        ("What should be your sharding strategy?", "0"),
        ("Do you want to offload parameters and gradients to CPU? [yes/NO]: ", "no"),
        ("What should be your auto wrap policy?", "TRANSFORMER_BASED_WRAP"),
        ("_no_split_modules", "no"),
        ("transformer layer class names", "BertLayer"),
        ("backward prefetch policy?", "0"),
        ("forward prefetch policy? [yes/NO]: ", ""),
        ("use_orig_params", ""),
        ("state dict type?", "0"),
        ("CPU RAM efficient loading)? [YES/no]: ", ""),
        ("activation checkpointing? [yes/NO]: ", ""),
        ("How many GPU(s) should be used for distributed training? [1]: ", "two"),  # invalid: asked again
        ("Please enter an integer", "2"),
        ("comma-seperated list? [all]: ", ""),
        ("numa efficiency", ""),
        ("Do you wish to use mixed precision? ([0] no, [1] fp16, [2] bf16, [3] fp8): ", "2"),
    ]
    code, transcript = _converse(
        ["config", "--config_file", str(target)], dialogue, {"HF_HOME": str(tmp_path / "home")}
    )
    assert code == 0, transcript
    written = yaml.safe_load(target.read_text())
    assert written == {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "distributed_type": "FSDP",
        "downcast_bf16": False,
        "enable_cpu_affinity": False,
        "fsdp_config": {
            "fsdp_activation_checkpointing": False,
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_backward_prefetch": "BACKWARD_PRE",
            "fsdp_cpu_ram_efficient_loading": True,
            "fsdp_forward_prefetch": False,
            "fsdp_offload_params": False,
            "fsdp_sharding_strategy": "FULL_SHARD",
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
            "fsdp_sync_module_states": True,
            "fsdp_transformer_layer_cls_to_wrap": "BertLayer",
            "fsdp_use_orig_params": True,
            "fsdp_version": 1,
        },
        "gpu_ids": "all",
        "machine_rank": 0,
        "main_training_function": "main",
        "mixed_precision": "bf16",
        "num_machines": 1,
        "num_processes": 2,
        "rdzv_backend": "static",
        "same_network": False,
        "tpu_use_cluster": False,
        "tpu_use_sudo": False,
        "use_cpu": False,
    }


def test_cpu_questionnaire_to_default_location(tmp_path: Path) -> None:
    home = tmp_path / "home"
    dialogue = [
        ("compute environment", "This machine"),
        ("Which type of machine are you using?", "0"),
        ("CPU only", "yes"),
        ("Intel PyTorch Extension (IPEX)", ""),
        ("torch dynamo", ""),
        ("mixed precision?", "no"),
    ]
    code, transcript = _converse(["config"], dialogue, {"HF_HOME": str(home)})
    assert code == 0, transcript
    written = yaml.safe_load((home / "accelerate" / "default_config.yaml").read_text())
    assert written["distributed_type"] == "NO" and written["use_cpu"] is True and written["num_processes"] == 1
    assert written["mixed_precision"] == "no"


def test_parallelism_questionnaire_writes_the_sizes_expert_parallel_included(tmp_path: Path) -> None:
    from accel_launch.commands.config.config_args import load_config_from_file
    from accel_launch.plan import MachineInfo, resolve

    target = tmp_path / "nd.yaml"
    dialogue = [  # asked after the FSDP questions when FSDP 2 is chosen, as the documented system asks them
        ("compute environment", "0"),
        ("Which type of machine are you using?", "2"),
        ("How many different machines", ""),
        ("Should distributed operations be checked", "no"),
        ("torch dynamo", ""),
        ("Do you want to use DeepSpeed? [yes/NO]: ", "no"),
        ("Do you want to use FullyShardedDataParallel? [yes/NO]: ", "yes"),
        ("What should be your FSDP version?", "1"),
        ("resharding after forward", ""),
        ("offload parameters and gradients to CPU? [yes/NO]: ", "no"),
        ("What should be your auto wrap policy?", "TRANSFORMER_BASED_WRAP"),
        ("_no_split_modules", "no"),
        ("transformer layer class names", "BertLayer"),
        ("state dict type?", "0"),
        ("CPU RAM efficient loading)? [YES/no]: ", ""),
        ("activation checkpointing? [yes/NO]: ", ""),
        ("(data, tensor, context and expert parallel sizes)? [yes/NO]: ", "yes"),
        ("What is the data parallel replicate size? [1]: ", ""),
        ("What is the data parallel shard (FSDP) size? [1]: ", "2"),
        ("What is the tensor parallel size? [1]: ", ""),
        ("What is the context parallel size? [1]: ", "2"),
        ("Which context parallel communication should be used? ([0] allgather, [1] alltoall): ", "alltoall"),
        ("What is the expert parallel size", "0"),  # below 1: asked again
        ("Please enter an integer (at least 1).", "2"),
        ("How many GPU(s) should be used for distributed training? [1]: ", "8"),
        ("comma-seperated list? [all]: ", ""),
        ("numa efficiency", ""),
        ("mixed precision?", "no"),
    ]
    code, transcript = _converse(
        ["config", "--config_file", str(target)], dialogue, {"HF_HOME": str(tmp_path / "home")}
    )
    assert code == 0, transcript
    written = yaml.safe_load(target.read_text())
    assert written["num_processes"] == 8
    assert written["parallelism_config"] == {
        "parallelism_config_dp_replicate_size": 1,
        "parallelism_config_dp_shard_size": 2,
        "parallelism_config_tp_size": 1,
        "parallelism_config_cp_size": 2,
        "parallelism_config_cp_comm_strategy": "alltoall",
        "parallelism_config_ep_size": 2,
    }
    plan = resolve({}, load_config_from_file(str(target)), MachineInfo("cpu", 0, 8), "train.py")
    assert plan.env["PARALLELISM_CONFIG_EP_SIZE"] == "2" and plan.env["PARALLELISM_CONFIG_CP_SIZE"] == "2"
    assert plan.warnings == ()  # dp_shard 2 x ep 2 x cp 2 is the 8 processes
