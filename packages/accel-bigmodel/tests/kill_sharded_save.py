"""Child of the SIGKILL test in test_bigmodel_checkpoint_safety.py: one fresh interpreter that saves a
small network's state over ``FOLDER`` with ``save_sharded`` and SIGKILLs itself at its k-th file event
(half of each file's bytes written, each rename, link and removal); ``k = 0`` counts the events and
writes their labels to ``LOG``.

Usage: ``python kill_sharded_save.py FOLDER SEED MAX_SHARD_SIZE KILL_AT FORMAT LOG``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch
from torch import nn


def net(seed: int = 0) -> nn.Module:
    """The network every save of the test writes (its values depend on ``seed`` only)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))


def main(folder: str, seed: int, shard: int, kill_at: int, fmt: str, log: str) -> None:
    from accel_state.kill_points import StepCounter, die_with_parent

    die_with_parent()
    import accel_bigmodel.safe_write as sw
    from accel_bigmodel.sharding import save_sharded

    counter = StepCounter(kill_at, log)
    real_write_all = sw._write_all

    def write_all(handle: Any, data: Any) -> None:
        view = memoryview(data).cast("B")
        real_write_all(handle, view[: view.nbytes // 2])
        handle.flush()
        counter.tick("write:half")
        real_write_all(handle, view[view.nbytes // 2 :])

    sw._write_all = write_all  # type: ignore[assignment]
    for name in ("replace", "link", "remove"):
        counter.wrap(os, name)
    save_sharded(net(seed).state_dict(), folder, max_shard_size=shard, safe_serialization=fmt == "safetensors")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6])
