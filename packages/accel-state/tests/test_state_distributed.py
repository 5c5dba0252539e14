"""Every collective and process-control helper on two real gloo processes."""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import pytest
import torch

from accel_state.testing import DistributedPool, DistributedTestFailure, run_distributed


class Pair(NamedTuple):
    left: torch.Tensor
    right: torch.Tensor


def _state() -> Any:
    from accel_state.state import PartialState

    return PartialState()


def collectives_on_nested_data() -> dict[str, Any]:
    from accel_state import operations as ops

    state = _state()
    rank = state.process_index
    nested = {"a": torch.full((2,), float(rank)), "b": [Pair(torch.tensor([rank]), torch.ones(1, 2) * rank)]}
    gathered = ops.gather(nested)
    scalar = ops.gather(torch.tensor(float(rank)))
    ragged = torch.arange(rank + 2)  # lengths 2 and 3
    padded = ops.pad_across_processes(ragged, pad_index=-1)
    padded_first = ops.pad_across_processes(torch.ones(rank + 1, 2), dim=0, pad_first=True)
    matrix = ops.pad_across_processes(torch.ones(2, rank + 1), dim=1)
    return {
        "type": (type(gathered).__name__, type(gathered["b"][0]).__name__),
        "a": gathered["a"].tolist(),
        "left": gathered["b"][0].left.tolist(),
        "right_shape": tuple(gathered["b"][0].right.shape),
        "scalar": scalar.tolist(),
        "objects": ops.gather_object([f"r{rank}", rank]),
        "single_objects": ops.gather_object({"rank": rank}),
        "sum": ops.reduce(torch.tensor([rank + 1.0]), "sum").item(),
        "mean": ops.reduce({"x": torch.tensor([rank * 2.0])}, "mean")["x"].item(),
        "none": ops.reduce(torch.tensor([rank + 0.0]), "none").item(),
        "broadcast": ops.broadcast(torch.tensor([rank + 10]), from_process=1).item(),
        "objects_from_0": ops.broadcast_object_list([{"r": rank}, rank], from_process=0),
        "padded": padded.tolist(),
        "padded_first": padded_first[:, 0].tolist(),
        "matrix_shape": tuple(matrix.shape),
        "copied": ops.copy_tensor_to_devices(torch.arange(3) if rank == 0 else None).tolist(),
    }


def test_collectives_on_two_processes(dist_pool: DistributedPool) -> None:
    r0, r1 = dist_pool.run(collectives_on_nested_data)
    assert r0["type"] == ("dict", "Pair")
    assert r0["a"] == r1["a"] == [0.0, 0.0, 1.0, 1.0]
    assert r0["left"] == [0, 1] and r0["right_shape"] == (2, 2)
    assert r0["scalar"] == [0.0, 1.0]
    assert r0["objects"] == ["r0", 0, "r1", 1]
    assert r1["single_objects"] == [{"rank": 0}, {"rank": 1}]
    assert r0["sum"] == r1["sum"] == 3.0
    assert r0["mean"] == r1["mean"] == 1.0
    assert (r0["none"], r1["none"]) == (0.0, 1.0)
    assert r0["broadcast"] == r1["broadcast"] == 11
    assert r1["objects_from_0"] == [{"r": 0}, 0]
    assert r0["padded"] == [0, 1, -1] and r1["padded"] == [0, 1, 2]
    assert r0["padded_first"] == [0.0, 1.0] and r1["padded_first"] == [1.0, 1.0]
    assert r0["matrix_shape"] == r1["matrix_shape"] == (2, 2)
    assert r1["copied"] == [0, 1, 2]


def process_control() -> dict[str, Any]:
    from accel_state import operations as ops

    state = _state()
    rank = state.process_index
    order: list[float] = []
    with state.main_process_first():
        order.append(time.monotonic())
        if state.is_main_process:
            time.sleep(0.3)
    stamps = ops.gather_object([order[0]])
    ran = []
    state.on_main_process(lambda: ran.append("main"))()
    state.on_last_process(lambda: ran.append("last"))()
    state.on_process(process_index=1)(lambda: ran.append("p1"))()
    state.on_local_process(local_process_index=0)(lambda: ran.append("l0"))()
    with state.split_between_processes(list(range(5))) as share:
        shares = share
    with state.split_between_processes({"x": torch.arange(5)}, apply_padding=True) as padded:
        padded_share = padded["x"].tolist()
    return {
        "rank": rank,
        "main_first": stamps[0] <= stamps[1],
        "ran": ran,
        "share": shares,
        "padded": padded_share,
        "world": (state.num_processes, state.distributed_type.value, state.backend, state.use_distributed),
        "flags": (state.is_main_process, state.is_local_main_process, state.is_last_process),
    }


def test_process_control_on_two_processes(dist_pool: DistributedPool) -> None:
    r0, r1 = dist_pool.run(process_control)
    assert r0["main_first"] and r1["main_first"]
    assert r0["world"] == (2, "MULTI_CPU", "gloo", True)
    assert r0["flags"] == (True, True, False) and r1["flags"] == (False, False, True)
    assert r0["ran"] == ["main", "l0"] and r1["ran"] == ["last", "p1"]
    assert r0["share"] == [0, 1, 2] and r1["share"] == [3, 4]
    assert r0["padded"] == [0, 1, 2] and r1["padded"] == [3, 4, 4]


def rng_and_logging() -> dict[str, Any]:
    import logging

    from accel_state.enums import RNGType
    from accel_state.logging import get_logger
    from accel_state.random import set_seed, synchronize_rng_states

    state = _state()
    set_seed(100, device_specific=True)
    differs = torch.rand(1).item()
    torch.manual_seed(state.process_index)
    generator = torch.Generator().manual_seed(50 + state.process_index)
    synchronize_rng_states([RNGType.TORCH, "generator"], generator=generator)
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logger = get_logger(f"accel_dist_test_{state.process_index}", log_level="INFO")
    logger.logger.addHandler(Keep())
    logger.info("main only")
    logger.info("all", main_process_only=False)
    logger.info("ordered", main_process_only=False, in_order=True)
    return {
        "differs": differs,
        "torch": torch.rand(2).tolist(),
        "gen": torch.rand(2, generator=generator).tolist(),
        "logs": records,
    }


def test_rng_synchronisation_and_logger(dist_pool: DistributedPool) -> None:
    r0, r1 = dist_pool.run(rng_and_logging)
    assert r0["differs"] != r1["differs"]
    assert r0["torch"] == r1["torch"]
    assert r0["gen"] == r1["gen"]
    assert r0["logs"] == ["main only", "all", "ordered"]
    assert r1["logs"] == ["all", "ordered"]


def mismatched_gather() -> None:
    state = _state()
    from accel_state.nested import DistributedOperationException
    from accel_state.operations import broadcast, gather

    dtype = torch.float32 if state.process_index == 0 else torch.int64
    try:
        broadcast(torch.ones(2, dtype=dtype))
    except DistributedOperationException as error:
        dtype_message = str(error)
    else:
        raise AssertionError("a dtype mismatch went through")
    assert "- Process 0: [2] (float32)" in dtype_message and "- Process 1: [2] (int64)" in dtype_message, dtype_message
    gather({"x": torch.ones(state.process_index + 1, 3)})


def test_debug_mode_turns_a_shape_mismatch_into_an_error_on_every_rank() -> None:
    start = time.monotonic()
    with pytest.raises(DistributedTestFailure) as failure:
        run_distributed(mismatched_gather, env={"ACCELERATE_DEBUG_MODE": "1"}, timeout=60)
    elapsed = time.monotonic() - start
    text = str(failure.value)
    assert "failed on rank(s) [0, 1]" in text
    assert text.count("DistributedOperationException") >= 2
    assert "Cannot apply desired operation due to shape mismatches" in text
    assert "Operation: `accel_state.operations.gather`" in text
    assert "- Process 0: {'x': [1, 3]}" in text and "- Process 1: {'x': [2, 3]}" in text
    assert elapsed < 60


def failing_on_rank_one() -> None:
    if _state().process_index == 1:
        raise ValueError("only rank one breaks")


def test_pool_reports_which_rank_failed_and_recovers(dist_pool: DistributedPool) -> None:
    with pytest.raises(DistributedTestFailure, match="(?s)failed on rank\\(s\\) \\[1\\].*only rank one breaks"):
        dist_pool.run(failing_on_rank_one)
    assert [r["rank"] for r in dist_pool.run(process_control)] == [0, 1]


def busy_for(seconds: float) -> str:
    end, spins = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        spins += 1
    return "done"


def idle_for(seconds: float) -> str:
    time.sleep(seconds)
    return "not reached"


def test_pool_timeout_counts_idle_time_only(dist_pool: DistributedPool) -> None:
    # Ranks that keep the CPU busy past the timeout are slow, not hung (a loaded machine): the call waits.
    # 5 s: past the 3 s timeout by a whole poll of the pool (2 s), each spinning rank's CPU well spent.
    assert dist_pool.run(busy_for, 5.0, timeout=3) == ["done", "done"]
    # Ranks that use no CPU (blocked, as in a hang) fail the call once the timeout has passed.
    start = time.monotonic()
    with pytest.raises(DistributedTestFailure, match=r"did not answer within 3 s in which the ranks used no CPU"):
        dist_pool.run(idle_for, 120.0, timeout=3)
    assert time.monotonic() - start < 60
    assert [r["rank"] for r in dist_pool.run(process_control)] == [0, 1]  # restarted, usable again


def rank_zero_raises_rank_one_waits() -> str:
    import torch.distributed as dist

    _state()
    if dist.get_rank() == 0:
        raise RuntimeError("rank 0 gave up")
    dist.barrier()  # never joined by rank 0
    return "not reached"


def test_once_a_rank_raised_the_others_are_not_waited_on_for_the_whole_timeout(dist_pool: DistributedPool) -> None:
    start = time.monotonic()
    with pytest.raises(
        DistributedTestFailure,
        match=r"(?s)rank\(s\) \[1\] did not answer within 20.0 s after "
        r"rank\(s\) \[0\] raised.*rank 0 gave up",
    ):
        dist_pool.run(rank_zero_raises_rank_one_waits, timeout=600)
    assert time.monotonic() - start < 120
    assert [r["rank"] for r in dist_pool.run(process_control)] == [0, 1]  # restarted, usable again


def works_kept_by_collectives() -> dict[str, Any]:
    import torch.distributed as dist

    from accel_state import kept_works
    from accel_state import operations as ops

    state = _state()
    rank = state.process_index
    kept_works.pin_kept_works()  # start from an empty queue (earlier tests of this pool kept some)
    ops.gather(torch.tensor([rank]))
    after_gather = kept_works.kept_works()
    objects = {"rank": rank, "nested": [b"\x00" * (rank + 1), {"text": "é" * rank}]}
    ours: list[Any] = [None, None]
    kept_works.all_gather_object(ours, objects)
    theirs: list[Any] = [None, None]
    dist.all_gather_object(theirs, objects)
    for _ in range(3 * kept_works.KEPT_WORKS):
        ops.reduce(torch.ones(1), "sum")
    bounded = kept_works.kept_works()
    kept_works.pin_kept_works()
    after_pin = kept_works.kept_works()
    mismatch = ""
    try:
        ops.broadcast_object_list([1, 2] if rank == 0 else [None])
    except ValueError as error:
        mismatch = str(error)
    return {
        "after_gather": after_gather,
        "same_as_torch": ours == theirs,
        "objects": ours,
        "bounded": bounded,
        "after_pin": after_pin,
        "mismatch": mismatch,
    }


def test_collectives_keep_their_last_works_and_the_object_collectives_match_torch(dist_pool: DistributedPool) -> None:
    # issue 37: a gloo thread that frees a finished work after the interpreter began to shut down aborts
    # the process; accel's collectives keep their last works referenced so that never happens
    r0, r1 = dist_pool.run(works_kept_by_collectives)
    assert r0["after_gather"] == r1["after_gather"] == 1
    assert r0["same_as_torch"] and r1["same_as_torch"]
    assert r1["objects"][1] == {"rank": 1, "nested": [b"\x00\x00", {"text": "é"}]}
    assert r0["bounded"] == r1["bounded"] == 8  # the queue's length, however many collectives ran
    assert r0["after_pin"] == r1["after_pin"] == 0
    assert r0["mismatch"] == ""
    assert "process 0 sent 2 objects, this process's list has 1" in r1["mismatch"]
