"""XLA for real: with torch_xla installed, runs on its CPU device (``PJRT_DEVICE=CPU``) and compares with
the same work on the CPU. Skipped where torch_xla is not installed (the normal test run, torch 2.13, for
which torch_xla publishes no build); ``nox -s xla`` builds an environment with torch 2.9.0 and
torch_xla 2.9.0 and runs this file (a release check: see the README's test section).

The backend contract suite (``cpu_backends.py``) runs its cases in a 2-process gloo pool; XLA runs one
replica here, so its contract cases (exact resume, a planted pickle refused, nothing changed by a refused
load) are the tests below.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

if importlib.util.find_spec("torch_xla") is None:
    pytest.skip(
        "torch_xla is not installed: `nox -s xla` runs these tests with torch 2.9.0 + torch_xla 2.9.0",
        allow_module_level=True,
    )
os.environ.setdefault("PJRT_DEVICE", "CPU")  # before torch_xla's runtime starts: its CPU device
import torch_xla
from xla_train_script import run

from accel_state.enums import DistributedType
from accel_state.errors import UnsafeCheckpointError
from accel_state.state import PartialState
from accel_state.testing import reset_shared_state

# autograd sizes its per-device queues at the first backward of a process, from the devices known then:
# torch_xla's device counts only once its runtime started. Start it while collecting, before any test (of
# another module too) runs a backward on the CPU.
torch_xla.device()

SCRIPT = os.path.join(os.path.dirname(__file__), "xla_train_script.py")


class Exploit:
    """Unpickling this calls ``os.system``: it would create the marker file."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, (f"touch {self.marker}",))


def _xm():  # type: ignore[no-untyped-def]
    import torch_xla.core.xla_model as xm

    return xm


def test_the_script_trains_on_xla_with_the_losses_of_the_cpu(tmp_path) -> None:
    """A plain ``python train.py`` picks XLA and ``xla:0``; its losses are those of ``cpu=True``."""
    env = {**os.environ, "PJRT_DEVICE": "CPU"}
    env.pop("USE_TORCH_XLA", None)
    done = subprocess.run(
        [sys.executable, SCRIPT, str(tmp_path / "xla")], env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    on_xla = json.loads(done.stdout.strip().splitlines()[-1])
    on_cpu = run(str(tmp_path / "cpu"), cpu=True)
    assert (on_xla["distributed_type"], on_xla["device"]) == ("XLA", "xla:0")
    assert (on_cpu["distributed_type"], on_cpu["device"]) == ("NO", "cpu")
    assert len(on_xla["losses"]) == 8
    assert on_xla["losses"] == pytest.approx(on_cpu["losses"], abs=1e-4)
    assert on_xla["exact"] and on_cpu["exact"]  # save_state, weights changed, load_state: the saved weights
    assert os.path.isfile(os.path.join(on_xla["folder"], "model.safetensors"))


def test_accumulate_and_clipping_on_xla_match_the_cpu(tmp_path) -> None:
    on_xla = run(str(tmp_path / "xla"), gradient_accumulation_steps=2)
    reset_shared_state()
    on_cpu = run(str(tmp_path / "cpu"), cpu=True, gradient_accumulation_steps=2)
    assert on_xla["distributed_type"] == "XLA"
    assert on_xla["losses"] == pytest.approx(on_cpu["losses"], abs=1e-4)


def test_bf16_trains_on_xla_close_to_fp32(tmp_path) -> None:
    bf16 = run(str(tmp_path / "bf16"), mixed_precision="bf16")
    reset_shared_state()
    fp32 = run(str(tmp_path / "fp32"), cpu=True)
    assert bf16["distributed_type"] == "XLA" and bf16["exact"]
    assert bf16["losses"] != fp32["losses"]  # the forward ran in bf16 ...
    assert bf16["losses"] == pytest.approx(fp32["losses"], abs=5e-2)  # ... and trained the same model


def test_use_torch_xla_0_and_cpu_true_stay_on_the_cpu(monkeypatch) -> None:
    monkeypatch.setenv("USE_TORCH_XLA", "0")
    state = PartialState()
    assert (state.distributed_type, state.device.type) == (DistributedType.NO, "cpu")
    reset_shared_state()
    monkeypatch.delenv("USE_TORCH_XLA")
    state = PartialState(cpu=True)
    assert (state.distributed_type, state.device.type) == (DistributedType.NO, "cpu")
    reset_shared_state()
    state = PartialState()
    assert (state.distributed_type, str(state.device), state.num_processes, state.process_index) == (
        DistributedType.XLA,
        "xla:0",
        1,
        0,
    )


def test_a_planted_pickle_is_refused_and_nothing_changes(tmp_path) -> None:
    from accel_train import Accelerator

    accelerator = Accelerator()
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.backward(model(torch.randn(3, 4, device=accelerator.device)).sum())
    optimizer.step()
    folder = str(tmp_path / "checkpoint")
    accelerator.save_state(folder)
    path = os.path.join(folder, "optimizer.bin")
    marker = str(tmp_path / "marker")
    state = torch.load(path, weights_only=True)
    state["param_groups"][0]["planted"] = Exploit(marker)
    torch.save(state, path)
    before = {k: v.cpu().clone() for k, v in model.state_dict().items()}
    with pytest.raises(UnsafeCheckpointError) as info:
        accelerator.load_state(folder)
    assert info.value.path == path
    assert not os.path.exists(marker), "the planted pickle ran"
    after = {k: v.cpu() for k, v in model.state_dict().items()}
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_torch_xla_generator_and_optimizer_state_come_back(tmp_path) -> None:
    from accel_train import Accelerator

    accelerator = Accelerator()
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    accelerator.backward(model(torch.randn(3, 4, device=accelerator.device)).sum())
    optimizer.step()
    scheduler.step()
    _xm().set_rng_state(1234)
    folder = str(tmp_path / "checkpoint")
    accelerator.save_state(folder)
    saved_seed = _xm().get_rng_state()
    saved_avg = optimizer.optimizer.state_dict()["state"][0]["exp_avg"].cpu().clone()
    saved_lr = scheduler.get_last_lr()
    torch.rand(3, device=accelerator.device)
    _xm().set_rng_state(99)
    accelerator.backward(model(torch.randn(3, 4, device=accelerator.device)).sum())
    optimizer.step()
    scheduler.step()
    accelerator.load_state(folder)
    assert _xm().get_rng_state() == saved_seed
    assert torch.equal(optimizer.optimizer.state_dict()["state"][0]["exp_avg"].cpu(), saved_avg)
    assert scheduler.get_last_lr() == saved_lr


def test_loader_position_resumes_at_the_next_batch(tmp_path) -> None:
    from accel_train import Accelerator

    data = torch.arange(32.0).reshape(16, 2)

    def prepared() -> tuple:
        accelerator = Accelerator()
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data), batch_size=2)
        return accelerator, accelerator.prepare(loader)

    accelerator, loader = prepared()
    seen = []
    for (batch,) in loader:
        assert batch.device.type == "xla"
        seen.append(batch.cpu())
        if len(seen) == 3:
            break
    folder = str(tmp_path / "checkpoint")
    accelerator.save_state(folder)
    reset_shared_state()
    accelerator, loader = prepared()
    accelerator.load_state(folder)
    (first,) = next(iter(loader))
    assert torch.equal(first.cpu(), data[6:8])


def test_skip_first_batches_keeps_the_device_loader() -> None:
    from accel_train import Accelerator

    accelerator = Accelerator()
    data = torch.arange(8.0).reshape(4, 2)
    loader = accelerator.prepare(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data), batch_size=1))
    batches = [batch for (batch,) in accelerator.skip_first_batches(loader, 2)]
    assert [b.device.type for b in batches] == ["xla", "xla"]
    assert torch.equal(torch.cat([b.cpu() for b in batches]), data[2:])


def test_save_model_writes_cpu_safetensors(tmp_path) -> None:
    from safetensors.torch import load_file

    from accel_train import Accelerator

    accelerator = Accelerator()
    model = accelerator.prepare(torch.nn.Linear(4, 2))
    accelerator.save_model(model, str(tmp_path))
    written = load_file(str(tmp_path / "model.safetensors"))
    expected = {k: v.cpu() for k, v in model.state_dict().items()}
    assert set(written) == set(expected)
    assert all(torch.equal(written[k], expected[k]) for k in expected)


def test_collectives_go_through_torch_xla_on_one_replica() -> None:
    from accel_state.operations import broadcast, gather, reduce

    state = PartialState()
    tensor = torch.tensor([1.0, 2.0], device=state.device)
    assert gather(tensor).device.type == "xla"
    assert gather(tensor).cpu().tolist() == [1.0, 2.0]
    assert gather(torch.tensor(3.0, device=state.device)).cpu().tolist() == [3.0]
    assert reduce(tensor, "sum").cpu().tolist() == [1.0, 2.0]
    assert reduce(tensor, "mean", scale=2.0).cpu().tolist() == [2.0, 4.0]
    assert broadcast({"t": tensor})["t"].cpu().tolist() == [1.0, 2.0]


@pytest.mark.parametrize("how", ["flag", "config"])
def test_accel_launch_tpu_runs_the_main_function_on_xla(tmp_path, how: str) -> None:
    """``accel launch --tpu``, or a config file with ``distributed_type: XLA``, on one host: torch_xla spawns
    the script's ``main`` (pickled by reference, so the script is registered as a module), which runs on XLA."""
    script = tmp_path / "tpu_main.py"
    script.write_text(
        "import json\n"
        "def main():\n"
        "    from accel import Accelerator\n"
        "    accelerator = Accelerator()\n"
        "    print('RESULT', json.dumps([accelerator.distributed_type.value, str(accelerator.device),"
        " accelerator.num_processes]), flush=True)\n"
    )
    launch_args = ["--tpu", "--num_processes", "1"]
    if how == "config":
        config = tmp_path / "config.yaml"
        config.write_text(
            "compute_environment: LOCAL_MACHINE\ndistributed_type: XLA\nnum_processes: 1\n"
            "mixed_precision: 'no'\nmain_training_function: main\n"
        )
        launch_args = ["--config_file", str(config)]
    env = {**os.environ, "PJRT_DEVICE": "CPU"}
    done = subprocess.run(
        [sys.executable, "-m", "accel.commands.launch", *launch_args, str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    assert json.loads(line.split(" ", 1)[1]) == ["XLA", "xla:0", 1]
