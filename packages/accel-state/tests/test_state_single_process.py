"""The shared states and every helper in one process: collectives are identities here."""

from __future__ import annotations

import logging
import random
from datetime import timedelta
from typing import Any

import pytest
import torch

from accel_state import operations
from accel_state.enums import DistributedType, PrecisionType
from accel_state.environment import patch_environment
from accel_state.kwargs import InitProcessGroupKwargs
from accel_state.logging import get_logger
from accel_state.memory import find_executable_batch_size, release_memory, should_reduce_batch_size
from accel_state.random import set_seed
from accel_state.state import AcceleratorState, GradientState, PartialState


def test_partial_state_single_process_properties() -> None:
    state = PartialState(cpu=True)
    assert state.distributed_type == DistributedType.NO
    assert (state.num_processes, state.process_index, state.local_process_index) == (1, 0, 0)
    assert state.is_main_process and state.is_local_main_process and state.is_last_process
    assert not state.use_distributed and state.device == torch.device("cpu")
    assert "Num processes: 1" in repr(state)


def test_partial_state_is_shared_between_instances() -> None:
    first = PartialState(cpu=True)
    first.custom_marker = 42
    assert PartialState().custom_marker == 42


def test_uninitialised_state_says_what_to_do() -> None:
    state = object.__new__(PartialState)
    state.__dict__ = PartialState._shared_state
    with pytest.raises(AttributeError, match="not initialised yet. Create `PartialState\\(\\)`"):
        _ = state.device


def test_process_control_in_one_process() -> None:
    state = PartialState(cpu=True)
    calls = []
    state.on_main_process(lambda: calls.append("main"))()
    state.on_local_main_process(lambda: calls.append("local"))()
    state.on_last_process(lambda: calls.append("last"))()
    state.on_process(process_index=0)(lambda: calls.append("p0"))()
    state.on_process(process_index=1)(lambda: calls.append("p1"))()
    state.on_local_process(local_process_index=0)(lambda: calls.append("l0"))()
    with state.main_process_first():
        calls.append("first")
    state.wait_for_everyone()
    with state.split_between_processes([1, 2, 3]) as share:
        assert share == [1, 2, 3]
    assert calls == ["main", "local", "last", "p0", "l0", "first"]


def test_collectives_are_identities_in_one_process() -> None:
    PartialState(cpu=True)
    t = torch.arange(4.0)
    assert operations.gather(t) is t
    assert operations.gather_object(["a"]) == ["a"]
    assert operations.broadcast(t) is t
    assert operations.broadcast_object_list([1, 2]) == [1, 2]
    assert operations.reduce(t, "sum").tolist() == t.tolist()
    assert operations.reduce(t, "mean", scale=2.0).tolist() == (t * 2).tolist()
    assert operations.pad_across_processes(t) is t
    assert operations.copy_tensor_to_devices(t) is t
    assert operations.pad_input_tensors(torch.ones(3, 2), 3, 2).shape == (4, 2)


@pytest.mark.parametrize(
    "launcher",
    [
        {"RANK": "0", "WORLD_SIZE": "2"},
        {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0"},
        {"SLURM_NTASKS": "2", "SLURM_PROCID": "0"},
    ],
)
def test_collectives_refuse_a_world_that_was_never_initialised(launcher: dict) -> None:
    with (
        patch_environment(**launcher),
        pytest.raises(RuntimeError, match="gather needs torch.distributed.*2 processes.*PartialState"),
    ):
        operations.gather(torch.ones(1))


def test_reduce_rejects_an_unknown_reduction() -> None:
    with pytest.raises(ValueError, match="reduction must be 'sum', 'mean', 'max', 'min' or 'none', got 'avg'"):
        operations.reduce(torch.ones(1), "avg")


def test_accelerator_state_reads_mixed_precision_and_delegates() -> None:
    with patch_environment(ACCELERATE_MIXED_PRECISION="bf16"):
        state = AcceleratorState(cpu=True)
    assert state.mixed_precision == PrecisionType.BF16 == "bf16"
    assert state.num_processes == 1 and state.device.type == "cpu"
    assert "Mixed precision type: bf16" in repr(state)
    assert AcceleratorState(mixed_precision="bf16").mixed_precision == "bf16"
    with pytest.raises(
        ValueError,
        match="AcceleratorState has already been initialized and cannot be changed: it was initialised with mixed_precision='bf16', not 'fp16'",
    ):
        AcceleratorState(mixed_precision="fp16")


def test_accelerator_state_rejects_unknown_precision() -> None:
    with pytest.raises(
        ValueError, match="'fp12' is not a valid PrecisionType; choose one of \\['no', 'fp8', 'fp16', 'bf16'\\]"
    ):
        AcceleratorState(mixed_precision="fp12", cpu=True)


def test_accelerator_state_distributed_type_follows_plugins() -> None:
    class FakeFsdpPlugin:
        fsdp_version = 2

    state = AcceleratorState(cpu=True, fsdp_plugin=FakeFsdpPlugin())
    assert state.distributed_type == DistributedType.FSDP and state.is_fsdp2


def test_gradient_state_follows_plugin_and_active_loader() -> None:
    class Plugin:
        num_steps = 4
        adjust_scheduler = False
        sync_with_dataloader = True
        sync_each_batch = True

    class Loader:
        end_of_dataloader = True
        remainder = 3

    grad = GradientState(Plugin())
    assert (grad.num_steps, grad.adjust_scheduler, grad.sync_each_batch) == (4, False, True)
    assert not grad.in_dataloader and grad.remainder == -1 and not grad.end_of_dataloader
    loader = Loader()
    grad._add_dataloader(loader)
    assert grad.in_dataloader and grad.end_of_dataloader and grad.remainder == 3
    grad._remove_dataloader(loader)
    assert not grad.in_dataloader
    grad._set_sync_gradients(False)
    assert GradientState().sync_gradients is False


def test_init_process_group_kwargs_validates() -> None:
    kwargs = InitProcessGroupKwargs(backend="gloo", timeout=30)
    assert kwargs.timeout == timedelta(seconds=30)
    assert kwargs.to_kwargs() == {"backend": "gloo", "timeout": timedelta(seconds=30)}
    with pytest.raises(ValueError, match="backend='glooo' is not one of"):
        InitProcessGroupKwargs(backend="glooo")


def test_set_seed_makes_every_generator_repeat() -> None:
    np = pytest.importorskip("numpy")
    set_seed(123)
    first = (random.random(), np.random.rand(), torch.rand(1).item())
    set_seed(123)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == first


def test_find_executable_batch_size_shrinks_by_a_tenth_on_out_of_memory() -> None:
    tried = []

    @find_executable_batch_size(starting_batch_size=64)
    def train(batch_size: int, scale: int) -> int:
        tried.append(batch_size)
        if batch_size > 50:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2 GiB")
        return batch_size * scale

    assert tried == []
    assert train(10) == 450
    assert tried == [64, 57, 51, 45]  # int(64 * 0.9) = 57, int(57 * 0.9) = 51, int(51 * 0.9) = 45
    assert train(1) == 45  # the size that worked is where the next call starts
    assert tried[-1] == 45 and len(tried) == 5


def test_find_executable_batch_size_calls_reduce_fn_without_arguments() -> None:
    sizes = iter([10, 3])
    calls: list[tuple[Any, ...]] = []

    def smaller(*args: Any) -> int:
        calls.append(args)
        return next(sizes)

    @find_executable_batch_size(starting_batch_size=32, reduce_batch_size_fn=smaller)
    def train(batch_size: int) -> int:
        if batch_size > 5:
            raise torch.OutOfMemoryError("no room")
        return batch_size

    assert train() == 3
    assert calls == [(), ()]

    @find_executable_batch_size(starting_batch_size=32, reduce_batch_size_fn=lambda size: size - 20)
    def train_with_size_fn(batch_size: int) -> int:
        if batch_size > 12:
            raise torch.OutOfMemoryError("no room")
        return batch_size

    assert train_with_size_fn() == 12  # a function that needs the failed size still gets it


def test_find_executable_batch_size_passes_other_errors_and_stops_at_zero() -> None:
    @find_executable_batch_size(starting_batch_size=2)
    def never_fits(batch_size: int) -> None:
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory")

    with pytest.raises(RuntimeError, match="No executable batch size found"):
        never_fits()

    @find_executable_batch_size(starting_batch_size=8)
    def broken(batch_size: int) -> None:
        raise KeyError("bug")

    with pytest.raises(KeyError):
        broken()

    with pytest.raises(TypeError, match="Batch size was passed into `broken`"):
        broken(4)


def test_release_memory_and_oom_detection() -> None:
    a, b = torch.ones(10), torch.ones(10)
    a, b = release_memory(a, b)
    assert a is None and b is None
    assert should_reduce_batch_size(torch.OutOfMemoryError("x"))
    assert not should_reduce_batch_size(ValueError("out of memory"))


def test_logger_level_from_environment_and_main_only(caplog: pytest.LogCaptureFixture) -> None:
    with patch_environment(ACCELERATE_LOG_LEVEL="debug"):
        logger = get_logger("accel_test_logger")
    assert logger.logger.level == logging.DEBUG
    PartialState(cpu=True)
    with caplog.at_level(logging.DEBUG, logger="accel_test_logger"):
        logger.info("hello", main_process_only=True)
        logger.info("everyone", main_process_only=False, in_order=True)
        logger.warning_once("once")
        logger.warning_once("once")
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["hello", "everyone", "once"]
