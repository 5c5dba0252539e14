"""DeepSpeed under the real ``accel launch`` (2 CPU processes, gloo): a config file with "auto" values
next to an accel config, ZeRO-3 save at step k, and a resume in a fresh launch that ends where the
uninterrupted run ended."""

from __future__ import annotations

import json
import pathlib
import textwrap

import pytest
from conftest import accel_command, run_command

from accel_state.imports import is_deepspeed_available
from accel_state.install_hints import install_hint

pytestmark = pytest.mark.skipif(
    not is_deepspeed_available(), reason=f"needs DeepSpeed: {install_hint('accel-train', 'deepspeed')}"
)

SCRIPT = textwrap.dedent(
    """
    import json, os, sys, torch
    from accel_train import Accelerator

    folder, phase, save_at = sys.argv[1], sys.argv[2], 3
    accelerator = Accelerator()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.01)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(48, 4, generator=g)
    data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    plugin = accelerator.state.deepspeed_plugin

    def step(x, y):
        with accelerator.accumulate(model):
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            optimizer.step()
            optimizer.zero_grad()

    if phase == "first":
        for index, (x, y) in enumerate(loader):
            if index == save_at:
                accelerator.save_state(os.path.join(folder, "ckpt"))
            step(x, y)
    else:
        accelerator.load_state(os.path.join(folder, "ckpt"))
        for x, y in accelerator.skip_first_batches(loader, save_at):
            step(x, y)
    state = {k: v.float().tolist() for k, v in accelerator.get_state_dict(model).items()}
    if accelerator.is_main_process:
        with open(os.path.join(folder, f"{phase}.json"), "w") as handle:
            json.dump({"state": state, "config": plugin.deepspeed_config, "stage": model.zero_optimization_stage(),
                       "distributed_type": accelerator.distributed_type.value}, handle, default=str)
    accelerator.end_training()
    """
)

DS_CONFIG = {
    "zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": True, "reduce_bucket_size": 4096},
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
}

ACCEL_CONFIG = """\
compute_environment: LOCAL_MACHINE
deepspeed_config:
  deepspeed_config_file: {ds}
  zero3_init_flag: false
distributed_type: DEEPSPEED
machine_rank: 0
mixed_precision: 'no'
num_machines: 1
num_processes: 2
use_cpu: true
"""


def test_zero3_config_file_save_and_resume_in_a_fresh_launch(tmp_path: pathlib.Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps(DS_CONFIG))
    config = tmp_path / "accel.yaml"
    config.write_text(ACCEL_CONFIG.format(ds=ds))
    launch = [
        *accel_command(),
        "launch",
        "--config_file",
        str(config),
        "--gradient_clipping",
        "0.0",
        str(script),
        str(tmp_path),
    ]
    for phase in ("first", "resume"):
        result = run_command([*launch, phase], timeout=600)
        assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    first = json.loads((tmp_path / "first.json").read_text())
    resumed = json.loads((tmp_path / "resume.json").read_text())
    assert first["distributed_type"] == "DEEPSPEED" and first["stage"] == 3
    resolved = first["config"]
    assert resolved["train_micro_batch_size_per_gpu"] == 4
    assert resolved["train_batch_size"] == 8
    assert resolved["gradient_accumulation_steps"] == 1
    assert resolved["gradient_clipping"] == 0.0
    assert resolved["zero_optimization"]["reduce_bucket_size"] == 4096
    assert (tmp_path / "ckpt" / "pytorch_model").is_dir()
    for key, value in first["state"].items():
        flat_a = _flatten(value)
        flat_b = _flatten(resumed["state"][key])
        assert max(abs(a - b) for a, b in zip(flat_a, flat_b)) < 1e-6, key


def test_config_file_beside_conflicting_accel_config_keys(tmp_path: pathlib.Path) -> None:
    script = tmp_path / "job.py"
    script.write_text("from accel_train import Accelerator\nAccelerator()\n")
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps(DS_CONFIG))
    config = tmp_path / "accel.yaml"
    config.write_text(
        ACCEL_CONFIG.format(ds=ds).replace("  zero3_init_flag: false\n", "  zero_stage: 2\n  gradient_clipping: 1.0\n")
    )
    result = run_command(
        [*accel_command(), "launch", "--config_file", str(config), "--num_processes", "1", str(script)], timeout=300
    )
    assert result.returncode != 0
    assert "these accel config settings would be ignored: ['gradient_clipping', 'zero_stage']" in result.stderr


def _flatten(value: object) -> list[float]:
    if isinstance(value, list):
        return [item for part in value for item in _flatten(part)]
    return [float(value)]  # type: ignore[arg-type]
