"""A collective that a peer never enters ends with CollectiveTimeoutError naming the operation and
the absent ranks: pure message building, and two real gloo processes with a 3 s timeout."""

from __future__ import annotations

import time

from accel_state.hangs import CollectiveTimeoutError, describe, is_peer_failure, watched_collective
from accel_state.testing import run_distributed


def test_peer_failures_are_recognised() -> None:
    assert is_peer_failure(RuntimeError("[gloo] Timed out waiting 10000ms for send operation to complete"))
    assert is_peer_failure(RuntimeError("pair.cc:553] Connection closed by peer [127.0.0.1]:1"))
    assert not is_peer_failure(RuntimeError("Tensors must be contiguous"))


def test_describe_names_the_absent_ranks_and_where_they_are() -> None:
    positions = {
        0: {"operation": "gather", "number": 4},
        1: {"operation": "gather", "number": 4},
        2: {"operation": "wait_for_everyone", "number": 4},
    }
    message, missing = describe("gather", 4, 0, 10.0, positions, world_size=4)
    assert missing == [2, 3]
    assert "collective `gather` (#4 on rank 0)" in message and "after 10.0 s" in message
    assert "rank 2 waits in `wait_for_everyone` (its collective #4)" in message
    assert "rank 3 is not in any accel collective" in message
    assert "InitProcessGroupKwargs(timeout=...)" in message


def test_stale_notes_of_an_earlier_failure_are_ignored() -> None:
    now = time.time()
    positions = {
        0: {"operation": "gather", "number": 9, "failed_at": now},
        1: {"operation": "gather", "number": 9, "failed_at": now - 3600},
    }
    _, missing = describe("gather", 9, 0, 3.0, positions, world_size=2)
    assert missing == [1]


def test_other_errors_pass_through_and_nesting_counts_once() -> None:
    from accel_state import hangs

    @watched_collective("outer")
    def outer() -> int:
        return inner() + 1

    @watched_collective("inner")
    def inner() -> int:
        return hangs.collective_count()

    before = hangs.collective_count()
    assert outer() == before + 2  # inner saw the outer's number: counted once
    assert hangs.collective_count() == before + 1

    @watched_collective()
    def broken() -> None:
        raise RuntimeError("Tensors must be contiguous")

    try:
        broken()
    except RuntimeError as error:
        assert not isinstance(error, CollectiveTimeoutError)


def rank_skips_a_collective() -> dict:
    from datetime import timedelta

    import torch

    from accel_state.operations import gather
    from accel_state.state import PartialState

    state = PartialState(cpu=True, timeout=timedelta(seconds=3))
    started = time.monotonic()
    try:
        if state.process_index == 0:
            gather(torch.ones(2))
        else:
            state.wait_for_everyone()  # rank 1 skipped the gather
    except CollectiveTimeoutError as error:
        return {
            "operation": error.operation,
            "missing": error.missing,
            "message": str(error),
            "seconds": time.monotonic() - started,
        }
    return {"operation": None}


def test_missing_collective_names_operation_and_absent_rank_on_every_rank() -> None:
    results = run_distributed(rank_skips_a_collective, world_size=2, timeout=120)
    assert [r["operation"] for r in results] == ["gather", "wait_for_everyone"]
    assert [r["missing"] for r in results] == [[1], [0]]
    assert "rank 1 waits in `wait_for_everyone`" in results[0]["message"]
    assert "rank 0 waits in `gather`" in results[1]["message"]
    assert all(r["seconds"] < 30 for r in results)  # the 3 s timeout plus the exchange, not forever
