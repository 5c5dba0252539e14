"""FSDP through the real ``accel launch --config_file`` on two CPU processes: settings from the file
reach the wrapped model, a sharded checkpoint resumes in a fresh launch, ``accel merge-weights``
gives the full state dict."""

from __future__ import annotations

import json
import pathlib
import textwrap

import pytest
from conftest import accel_command, run_command

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch
    from accel import Accelerator

    class Block(torch.nn.Module):
        def __init__(self, width):
            super().__init__()
            self.up = torch.nn.Linear(width, 2 * width)
            self.down = torch.nn.Linear(2 * width, width)
        def forward(self, x):
            return x + self.down(torch.relu(self.up(x)))

    class Net(torch.nn.Module):
        def __init__(self, width=8):
            super().__init__()
            self.inp = torch.nn.Linear(4, width)
            self.blocks = torch.nn.ModuleList([Block(width) for _ in range(2)])
            self.head = torch.nn.Linear(width, 1)
        def forward(self, x):
            x = self.inp(x)
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    def facts(model):
        out = {"type": type(model).__name__}
        if type(model).__name__ == "FullyShardedDataParallel":
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            out["units"] = sorted(type(u.module).__name__ for u in FSDP.fsdp_modules(model))
            out["sharding"] = model.sharding_strategy.name
            out["backward_prefetch"] = getattr(model.backward_prefetch, "name", None)
            out["forward_prefetch"] = bool(model.forward_prefetch)
        else:
            from torch.distributed.fsdp import FSDPModule
            units = [m for m in model.modules() if isinstance(m, FSDPModule) and m is not model]
            out["units"] = sorted(type(m).__name__.removeprefix("FSDP") for m in units)
            out["reshard_after_forward"] = [
                m._get_fsdp_state()._fsdp_param_group.post_forward_mesh_info is not None for m in units
            ]
        out["local"] = sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in model.parameters())
        return out

    out_dir, mode, save_at, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    accelerator = Accelerator()
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    generator = torch.Generator().manual_seed(1)
    batches = [torch.randn(8, 4, generator=generator) for _ in range(steps)]
    rank, world = accelerator.process_index, accelerator.num_processes
    first = 0
    if mode == "resume":
        accelerator.load_state(os.path.join(out_dir, "ckpt"))
        first = save_at
    for step in range(first, steps):
        x = batches[step][rank * 4 : (rank + 1) * 4]
        loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        if mode == "train" and step + 1 == save_at:
            accelerator.save_state(os.path.join(out_dir, "ckpt"))
            accelerator.save_model(model, os.path.join(out_dir, "at_save"))
    accelerator.save_model(model, os.path.join(out_dir, "final_" + mode))
    if accelerator.is_main_process:
        info = facts(model)
        info["distributed_type"] = accelerator.distributed_type.value
        with open(os.path.join(out_dir, "facts_" + mode + ".json"), "w") as handle:
            json.dump(info, handle)
    """
)

FSDP2_CONFIG = """\
compute_environment: LOCAL_MACHINE
distributed_type: FSDP
use_cpu: true
num_machines: 1
num_processes: 2
mixed_precision: 'no'
fsdp_config:
  fsdp_version: 2
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_transformer_layer_cls_to_wrap: Block
  fsdp_reshard_after_forward: false
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_cpu_ram_efficient_loading: true
  fsdp_sync_module_states: true
"""

FSDP1_CONFIG = """\
compute_environment: LOCAL_MACHINE
distributed_type: FSDP
use_cpu: true
num_machines: 1
num_processes: 2
mixed_precision: 'no'
fsdp_config:
  fsdp_version: 1
  fsdp_sharding_strategy: SHARD_GRAD_OP
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_transformer_layer_cls_to_wrap: Block
  fsdp_backward_prefetch: BACKWARD_POST
  fsdp_forward_prefetch: true
  fsdp_state_dict_type: FULL_STATE_DICT
  fsdp_use_orig_params: true
"""


def _launch(tmp_path: pathlib.Path, config: str, *args: str) -> str:
    config_file = tmp_path / "config.yaml"
    config_file.write_text(config)
    script = tmp_path / "fsdp_script.py"
    script.write_text(SCRIPT)
    result = run_command(
        [*accel_command(), "launch", "--config_file", str(config_file), str(script), *args], timeout=600
    )
    text = result.stdout + result.stderr
    assert result.returncode == 0, text[-4000:]
    return text


def _weights(folder: pathlib.Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def test_fsdp2_config_resume_and_merge(tmp_path: pathlib.Path) -> None:
    import torch

    out = tmp_path / "run"
    out.mkdir()
    _launch(tmp_path, FSDP2_CONFIG, str(out), "train", "2", "5")
    facts = json.loads((out / "facts_train.json").read_text())
    assert facts["distributed_type"] == "FSDP" and facts["type"] == "FSDPNet"
    assert facts["units"] == ["Block", "Block"]
    assert facts["reshard_after_forward"] == [False, False]  # fsdp_reshard_after_forward: false took effect
    assert 270 < facts["local"] < 340  # about half of the 609 parameters
    ckpt = out / "ckpt"
    assert sorted(p.name for p in (ckpt / "pytorch_model_fsdp_0").iterdir()) == [
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
    ]
    assert (ckpt / "optimizer_0").is_dir() and not (ckpt / "model.safetensors").exists()

    _launch(tmp_path, FSDP2_CONFIG, str(out), "resume", "2", "5")
    uninterrupted, resumed = _weights(out / "final_train"), _weights(out / "final_resume")
    assert set(uninterrupted) == set(resumed)
    for name in uninterrupted:
        assert torch.equal(uninterrupted[name], resumed[name]), name

    merged = run_command([*accel_command(), "merge-weights", str(ckpt / "pytorch_model_fsdp_0"), str(tmp_path / "m")])
    assert merged.returncode == 0, merged.stderr
    at_save, merged_weights = _weights(out / "at_save"), _weights(tmp_path / "m")
    assert set(at_save) == set(merged_weights)
    for name in at_save:
        assert torch.equal(at_save[name], merged_weights[name]), name


def test_fsdp1_config_settings_reach_the_wrapped_model(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    _launch(tmp_path, FSDP1_CONFIG, str(out), "train", "2", "3")
    facts = json.loads((out / "facts_train.json").read_text())
    assert facts["type"] == "FullyShardedDataParallel"
    assert facts["units"] == ["Block", "Block", "Net"]
    assert facts["sharding"] == "SHARD_GRAD_OP"
    assert facts["backward_prefetch"] == "BACKWARD_POST" and facts["forward_prefetch"] is True
    assert {"model.safetensors", "optimizer.bin"} <= {p.name for p in (out / "ckpt").iterdir()}


@pytest.mark.parametrize(
    ("version", "wrapped"),
    [
        (2, "FSDPNet"),
        # before a release only (nox -s slow): the launcher's decision to shard one process does not depend
        # on the FSDP version, and FSDP1's sharded checkpoint on a one-process group is accel-train's
        pytest.param(
            1,
            "FullyShardedDataParallel",
            marks=pytest.mark.release(
                covered_by="the FSDP2 case and accel-train's test_checkpoint_of_n_processes_resumes_on_m[fsdp1]"
            ),
        ),
    ],
)
def test_one_launched_process_is_sharded(tmp_path: pathlib.Path, version: int, wrapped: str) -> None:
    """``accel launch --use_fsdp --num_processes 1`` shards on a one-rank group, as the documented launcher
    does (its FSDP run wraps the model whenever it launched the process)."""
    out = tmp_path / "run"
    out.mkdir()
    script = tmp_path / "fsdp_script.py"
    script.write_text(SCRIPT)
    flags = ["--cpu", "--num_processes", "1", "--use_fsdp", "--fsdp_version", str(version)]
    flags += ["--mixed_precision", "bf16", "--fsdp_state_dict_type", "SHARDED_STATE_DICT"]
    result = run_command([*accel_command(), "launch", *flags, str(script), str(out), "train", "2", "3"], timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    facts = json.loads((out / "facts_train.json").read_text())
    assert facts["distributed_type"] == "FSDP" and facts["type"] == wrapped
    assert facts["local"] == 609  # one rank holds every parameter
    assert (out / "ckpt" / "pytorch_model_fsdp_0" / ".metadata").is_file() and (out / "ckpt" / "optimizer_0").is_dir()


@pytest.mark.skipif("not __import__('torch').cuda.is_available() or __import__('torch').cuda.device_count() < 2")
def test_fsdp2_bf16_offload_on_two_gpus(tmp_path: pathlib.Path) -> None:
    """NCCL, bf16 and CPU offload for real (skipped without two GPUs)."""
    config = FSDP2_CONFIG.replace("use_cpu: true", "use_cpu: false").replace("'no'", "bf16")
    config += "  fsdp_offload_params: true\n"
    out = tmp_path / "run"
    out.mkdir()
    _launch(tmp_path, config, str(out), "train", "2", "3")
    assert json.loads((out / "facts_train.json").read_text())["units"] == ["Block", "Block"]
