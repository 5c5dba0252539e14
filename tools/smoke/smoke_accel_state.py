"""accel-state installed alone: a 2-process collective on CPU (gather, gather_object, broadcast_object_list, reduce)."""

from __future__ import annotations

import sys

from _common import check, installed_distributions, under_torchrun


def worker() -> None:
    import torch

    from accel_state import PartialState
    from accel_state.operations import broadcast_object_list, gather, gather_object, reduce

    state = PartialState(cpu=True)
    rank, world = state.process_index, state.num_processes
    check(world == 2, f"expected 2 processes, got {world}")
    gathered = gather(torch.tensor([rank, rank * 10]))
    check(gathered.tolist() == [0, 0, 1, 10], f"gather gave {gathered.tolist()}")
    objects = gather_object([{"rank": rank}])
    check(objects == [{"rank": 0}, {"rank": 1}], f"gather_object gave {objects}")
    sent = broadcast_object_list([f"from rank {rank}", rank])
    check(sent == ["from rank 0", 0], f"broadcast_object_list gave {sent}")
    total = reduce(torch.tensor(float(rank + 1)), reduction="sum")
    check(float(total) == 3.0, f"reduce gave {float(total)}")
    state.wait_for_everyone()
    if state.is_main_process:
        print("accel-state smoke: 2-process gather, gather_object, broadcast_object_list, reduce OK")


if __name__ == "__main__":
    if "--worker" not in sys.argv:
        print("installed:", ", ".join(installed_distributions()))
    if under_torchrun(__file__):
        worker()
