"""FSDP with one launched process: the model is sharded on a one-rank group, as the documented system does.

A launcher sets ``LOCAL_RANK`` (``accel launch --use_fsdp --num_processes 1``, torchrun); here it is set by
hand in this process. The run must train exactly like ``fully_shard`` / ``FullyShardedDataParallel``
applied by hand with the same mixed-precision policy on a one-rank group, and unlike a plain autocast
run (fp32 parameters); its checkpoints must resume exactly.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from fsdp_helpers import mse, regression_batches

from accel_state.environment import patch_environment
from accel_state.testing import reset_shared_state
from accel_train import FullyShardedDataParallelPlugin
from accel_train.strategies.fsdp import group as fsdp_group

BF16 = torch.bfloat16


class GainNet(torch.nn.Module):
    """Two layers and an elementwise gain: the gain is where bf16 parameters and fp32 ones under autocast
    part (autocast leaves a multiplication in the wider dtype, FSDP's bf16 copy of the gain is rounded)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(4, 8)
        self.head = torch.nn.Linear(8, 1)
        self.gain = torch.nn.Parameter(torch.full((1,), 1.2345678))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.inp(x))) * self.gain


@pytest.fixture(autouse=True)
def _no_group_left() -> Iterator[None]:
    yield
    fsdp_group.destroy_single_process_group()
    if dist.is_initialized():  # a group a test started by hand
        dist.destroy_process_group()
    reset_shared_state()


def _is_wrapped(model: torch.nn.Module, version: int) -> bool:
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    return isinstance(model, FSDP if version == 1 else FSDPModule)


def _accel_run(version: int, state_dict_type: str | None = None, launched: bool = True):
    from accel_train import Accelerator

    env = {"LOCAL_RANK": "0"} if launched else {}
    with patch_environment(**env):
        kwargs = {"fsdp_version": version}
        if state_dict_type is not None:
            kwargs["state_dict_type"] = state_dict_type
        accelerator = Accelerator(
            cpu=True, mixed_precision="bf16", fsdp_plugin=FullyShardedDataParallelPlugin(**kwargs)
        )
        torch.manual_seed(0)
        model = GainNet()
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
        model, optimizer = accelerator.prepare(model, optimizer)
    return accelerator, model, optimizer


def _accel_steps(accelerator, model, optimizer, batches) -> list[float]:
    losses = []
    for x, y in batches:
        loss = mse(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def _by_hand(version: int, batches) -> list[float]:
    """The same training with torch's FSDP applied by hand on a one-rank group (no accel)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    torch.manual_seed(0)
    model = GainNet()
    if version == 2:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy(param_dtype=BF16, reduce_dtype=BF16, output_dtype=BF16)
        fully_shard(model, mesh=init_device_mesh("cpu", (1,)), mp_policy=policy)
    else:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp import MixedPrecision

        policy = MixedPrecision(param_dtype=BF16, reduce_dtype=BF16, buffer_dtype=BF16)
        model = FSDP(model, mixed_precision=policy, device_id=torch.device("cpu"), use_orig_params=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    losses = []
    for x, y in batches:
        with torch.autocast("cpu", dtype=BF16):
            out = model(x)
        loss = mse(out, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    dist.destroy_process_group()
    return losses


@pytest.mark.parametrize("version", [2, 1])
def test_launched_one_process_trains_as_fsdp_applied_by_hand(version: int) -> None:
    batches = regression_batches(4, 8)
    accelerator, model, optimizer = _accel_run(version)
    assert accelerator.num_processes == 1 and dist.is_initialized() and dist.get_world_size() == 1
    assert _is_wrapped(model, version)
    assert str(accelerator.distributed_type) in ("FSDP", "DistributedType.FSDP")
    ours = _accel_steps(accelerator, model, optimizer, batches)
    assert fsdp_group.destroy_single_process_group() and not dist.is_initialized()
    reset_shared_state()

    assert ours == _by_hand(version, batches)
    reset_shared_state()

    # Not launched (a plain ``python script.py``): the plugin is not applied, the model trains under
    # autocast with fp32 parameters, as in the documented system, and the losses part.
    accelerator, model, optimizer = _accel_run(version, launched=False)
    assert isinstance(model, GainNet) and not _is_wrapped(model, version) and not dist.is_initialized()
    plain = _accel_steps(accelerator, model, optimizer, batches)
    assert plain != ours


@pytest.mark.parametrize(
    ("version", "state_dict_type", "layout"),
    [
        (2, "SHARDED_STATE_DICT", {"pytorch_model_fsdp_0", "optimizer_0"}),
        (1, "SHARDED_STATE_DICT", {"pytorch_model_fsdp_0", "optimizer_0"}),
        (2, "FULL_STATE_DICT", {"model.safetensors", "optimizer.bin"}),
        (1, "FULL_STATE_DICT", {"model.safetensors", "optimizer.bin"}),
    ],
)
def test_launched_one_process_checkpoint_resumes_exactly(
    tmp_path, version: int, state_dict_type: str, layout: set[str]
) -> None:
    batches = regression_batches(4, 8)
    accelerator, model, optimizer = _accel_run(version, state_dict_type)
    assert _is_wrapped(model, version)
    _accel_steps(accelerator, model, optimizer, batches[:2])
    folder = str(tmp_path / "ckpt")
    accelerator.save_state(folder)
    assert layout <= set(os.listdir(folder))
    after_save = _accel_steps(accelerator, model, optimizer, batches[2:])
    accelerator.load_state(folder)
    assert _accel_steps(accelerator, model, optimizer, batches[2:]) == after_save


@pytest.mark.parametrize(("version", "use_orig_params"), [(1, True), (1, False), (2, True)])
def test_a_bf16_model_under_mixed_precision_trains_as_its_float32_copy(version: int, use_orig_params: bool) -> None:
    """The weights are upcast to float32 at prepare (FSDP1 on its flat shards, FSDP2 before sharding):
    a model loaded in bf16 then trains exactly as the same values loaded in float32, with float32
    optimizer state, instead of keeping bf16 master weights."""
    from accel_train import Accelerator

    batches = regression_batches(4, 8)
    runs = []
    for loaded in (torch.bfloat16, torch.float32):
        with patch_environment(LOCAL_RANK="0"):
            plugin = FullyShardedDataParallelPlugin(fsdp_version=version, use_orig_params=use_orig_params)
            accelerator = Accelerator(cpu=True, mixed_precision="bf16", fsdp_plugin=plugin)
            torch.manual_seed(0)
            model = GainNet().to(torch.bfloat16).to(loaded)  # bf16 values either way
            optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
            if loaded is torch.bfloat16:
                with pytest.warns(UserWarning, match="upcast .* low-precision parameter"):
                    model, optimizer = accelerator.prepare(model, optimizer)
            else:
                model, optimizer = accelerator.prepare(model, optimizer)
        assert {p.dtype for p in model.parameters()} == {torch.float32}
        losses = _accel_steps(accelerator, model, optimizer, batches)
        state = {k: v.float() for k, v in accelerator.get_state_dict(model).items()}
        runs.append((losses, state))
        fsdp_group.destroy_single_process_group()
        reset_shared_state()
    (bf16_losses, bf16_state), (fp32_losses, fp32_state) = runs
    assert bf16_losses == fp32_losses
    assert all(torch.equal(bf16_state[k], fp32_state[k]) for k in fp32_state)


@pytest.mark.parametrize("version", [1, 2])
def test_a_full_checkpoint_in_the_reference_release_layout_loads(tmp_path, version: int) -> None:
    """The reference release writes an FSDP ``FULL_STATE_DICT`` model as ``pytorch_model_fsdp.bin`` (a
    torch file of the full state dict) and the optimizer as ``optimizer.bin`` (torch's full optimizer
    state dict, keyed by parameter name). A checkpoint laid out so resumes exactly here."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    batches = regression_batches(4, 8)
    accelerator, model, optimizer = _accel_run(version, "FULL_STATE_DICT")
    _accel_steps(accelerator, model, optimizer, batches[:2])
    folder = tmp_path / "ckpt"
    accelerator.save_state(str(folder))
    after_save = _accel_steps(accelerator, model, optimizer, batches[2:])

    # rewrite the model and optimizer files as the reference release names and writes them
    from accel_train.checkpoint.file_io import load_weights

    weights = load_weights(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    torch.save(weights, folder / "pytorch_model_fsdp.bin")
    accelerator.load_state(str(folder))  # back to the saved point, then the optimizer state by name
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    inner = accelerator.unwrap_model(model, keep_torch_compile=False) if version == 2 else model
    torch.save(get_optimizer_state_dict(inner, optimizer.optimizer, options=options), folder / "optimizer.bin")
    assert {"pytorch_model_fsdp.bin", "optimizer.bin"} <= set(os.listdir(folder))

    accelerator.load_state(str(folder))
    assert _accel_steps(accelerator, model, optimizer, batches[2:]) == after_save


def _accumulating_run(version: int):
    from accel_train import Accelerator

    with patch_environment(LOCAL_RANK="0"):
        accelerator = Accelerator(
            cpu=True, gradient_accumulation_steps=2, fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=version)
        )
        torch.manual_seed(0)
        model = GainNet()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model, optimizer = accelerator.prepare(model, optimizer)
    return accelerator, model, optimizer


def _micro_steps(accelerator, model, optimizer, batches) -> None:
    for x, y in batches:
        with accelerator.accumulate(model):
            accelerator.backward(mse(model(x), y))
            optimizer.step()
            optimizer.zero_grad()


def test_launched_one_process_fsdp1_refuses_a_save_between_accumulation_steps(tmp_path) -> None:
    # FSDP1 keeps the gathered gradients in its flat buffers: they cannot be written and put back
    accelerator, model, optimizer = _accumulating_run(1)
    _micro_steps(accelerator, model, optimizer, regression_batches(1, 4))
    with pytest.raises(ValueError, match="between two optimizer steps of gradient accumulation"):
        accelerator.save_state(str(tmp_path / "mid"))


def test_launched_one_process_fsdp2_resumes_exactly_between_accumulation_steps(tmp_path) -> None:
    """On one process accumulation keeps gradient sync on, so each micro-step's gradient is already in
    the sharded ``param.grad``: the save keeps it and the load puts it back."""
    batches = regression_batches(5, 4)
    accelerator, model, optimizer = _accumulating_run(2)
    _micro_steps(accelerator, model, optimizer, batches[:1])  # half of an accumulation cycle
    folder = str(tmp_path / "mid")
    accelerator.save_state(folder)
    from accel_train.checkpointing import grads_file

    assert grads_file(0) in os.listdir(folder)
    _micro_steps(accelerator, model, optimizer, batches[1:])
    straight = [_full(p).clone() for p in model.parameters()]
    accelerator.load_state(folder)
    _micro_steps(accelerator, model, optimizer, batches[1:])
    resumed = [_full(p) for p in model.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(straight, resumed))

    # without the saved gradient the resume parts: the check above can tell
    accelerator.load_state(folder)
    optimizer.zero_grad()
    for param in model.parameters():
        param.grad = None
    _micro_steps(accelerator, model, optimizer, batches[1:])
    assert not all(torch.equal(a, _full(b)) for a, b in zip(straight, model.parameters()))


# -- the one-rank group -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("environ", "expected"),
    [({}, False), ({"LOCAL_RANK": "0"}, True), ({"LOCAL_RANK": "-1"}, False), ({"LOCAL_RANK": " "}, False)],
)
def test_launched_reads_local_rank(environ: dict, expected: bool) -> None:
    assert fsdp_group.launched(environ) is expected


def test_group_is_started_once_and_only_ours_is_destroyed() -> None:
    cpu = torch.device("cpu")
    assert fsdp_group.start_single_process_group(cpu) is True
    assert dist.get_world_size() == 1 and dist.get_backend() == "gloo"
    assert fsdp_group.start_single_process_group(cpu) is False  # a group exists: kept
    assert fsdp_group.destroy_single_process_group() is True and not dist.is_initialized()
    assert fsdp_group.destroy_single_process_group() is False
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # somebody else's
    assert fsdp_group.start_single_process_group(cpu) is False
    assert fsdp_group.destroy_single_process_group() is False and dist.is_initialized()


@pytest.mark.parametrize("version", [2, 1])
def test_checkpoint_of_a_plain_run_resumes_in_a_launched_one(tmp_path, version: int) -> None:
    """The whole model of a plain ``python`` run writes the FSDP layout; a launched (sharded) run resumes it."""
    batches = regression_batches(4, 8)
    accelerator, model, optimizer = _accel_run(version, "SHARDED_STATE_DICT", launched=False)
    assert isinstance(model, GainNet)
    _accel_steps(accelerator, model, optimizer, batches[:2])
    folder = str(tmp_path / "ckpt")
    accelerator.save_state(folder)
    saved = {k: v.clone() for k, v in accelerator.get_state_dict(model).items()}
    moments = optimizer.state_dict()["state"]
    reset_shared_state()

    accelerator, model, optimizer = _accel_run(version, "SHARDED_STATE_DICT")
    assert _is_wrapped(model, version)
    accelerator.load_state(folder)
    loaded = accelerator.get_state_dict(model)
    assert set(loaded) == set(saved) and all(torch.equal(loaded[k], saved[k]) for k in saved)
    state = optimizer.state_dict()["state"]
    assert len(state) == len(moments) and all(
        torch.equal(_full(state[i]["exp_avg"]), moments[i]["exp_avg"]) for i in moments
    )


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
