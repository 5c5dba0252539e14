"""Two processes, one answer: a tour of accel-state's collectives.

Run with ``python -m torch.distributed.run --nproc_per_node 2 examples/collectives_demo.py``;
``nox -s integration`` runs it too (``integration_tests/test_state_collectives_demo.py``). Every line
printed comes from the main process, after the processes agree.
"""

from __future__ import annotations

import torch

from accel_state import (
    PartialState,
    broadcast_object_list,
    gather,
    gather_object,
    get_logger,
    pad_across_processes,
    reduce,
    set_seed,
)

logger = get_logger(__name__)


def main() -> None:
    state = PartialState()
    set_seed(0)
    rank, world = state.process_index, state.num_processes
    state.print(f"accel-state demo: {world} process(es), backend {state.backend}, device {state.device}")

    mine = torch.full((2,), float(rank))
    everyone = gather(mine)
    state.print(f"gather       {mine.tolist()} from each rank -> {everyone.tolist()}")

    total = reduce(torch.tensor([rank + 1.0]), reduction="sum")
    state.print(f"reduce(sum)  of rank+1 over ranks -> {total.item():.0f} (expected {world * (world + 1) // 2})")

    ragged = torch.arange(rank + 1)
    padded = pad_across_processes(ragged, pad_index=-1)
    state.print(f"pad          rank 0 holds {ragged.tolist() if rank == 0 else '...'} -> padded to {padded.tolist()}")

    names = gather_object([f"rank-{rank}"])
    state.print(f"gather_object -> {names}")

    message = ["hello from the main process" if state.is_main_process else None]
    broadcast_object_list(message)
    with state.split_between_processes(list(range(10))) as share:
        shares = gather_object([share])
    state.print(f"broadcast    every rank now holds {message[0]!r}")
    state.print(f"split        range(10) shared as {shares}")

    assert everyone.tolist() == [float(r) for r in range(world) for _ in range(2)]
    assert total.item() == world * (world + 1) // 2
    state.wait_for_everyone()
    state.print("all checks passed")


if __name__ == "__main__":
    main()
