"""megatron-core's checkpoint folders pass accel's checks before megatron-core reads them.

megatron-core's own save needs CUDA, so the folder is laid out here as its ``torch_dist`` backend lays it out
(``metadata.json``, a DCP ``.metadata`` and ``.distcp`` file, ``common.pt``) and read back through
megatron-core's real ``dist_checkpointing.load`` on 2 gloo processes: a good folder loads, and a planted
pickle in ``.metadata`` or ``common.pt``, or a folder of a backend accel cannot check, is refused by name on
both processes, before anything ran.
"""

from __future__ import annotations

import json
import os
import pickle

import pytest
import torch
from fsdp_helpers import crafted_torch_file

pytest.importorskip("megatron.core")


class _Exploit:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


def _lay_out(folder: str, weight: torch.Tensor) -> None:
    """A megatron-core ``torch_dist`` folder holding the sharded tensor ``w`` (collective: DCP writes it)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    dcp.save({"w": weight}, checkpoint_id=folder)
    if dist.get_rank() == 0:
        torch.save({"iteration": 3}, os.path.join(folder, "common.pt"))
        with open(os.path.join(folder, "metadata.json"), "w", encoding="utf-8") as handle:
            json.dump(
                {"sharded_backend": "torch_dist", "sharded_backend_version": 1, "common_backend": "torch"}, handle
            )
    dist.barrier()


def rank_load_each_variant(base: str, marker: str) -> dict[str, str]:
    """Load a good folder, then one with each damage; what each load gave (``ok`` or the error)."""
    import torch.distributed as dist
    from megatron.core.dist_checkpointing import ShardedTensor

    from accel_state import PartialState
    from accel_state.testing import reset_shared_state
    from accel_train.checkpoint import megatron_io

    reset_shared_state()
    PartialState(cpu=True)  # the pool's gloo group
    torch.manual_seed(0)
    weight = torch.randn(4, 3)
    results: dict[str, str] = {}

    def attempt(name: str, folder: str) -> None:
        target = torch.zeros(4, 3)
        try:
            state = megatron_io.load(
                {"w": ShardedTensor.from_rank_offsets("w", target, replica_id=dist.get_rank())}, folder
            )
        except Exception as error:
            results[name] = f"{type(error).__name__}: {error}"
        else:
            results[name] = "ok" if torch.equal(state["w"], weight) and state["iteration"] == 3 else "wrong values"

    names = ("good", "metadata", "common", "zarr")
    for name in names:  # every folder first: torch's DCP save does not follow megatron-core's load
        _lay_out(os.path.join(base, name), weight)
    for name in names:
        folder = os.path.join(base, name)
        if dist.get_rank() == 0:
            if name == "metadata":
                with open(os.path.join(folder, ".metadata"), "wb") as handle:
                    pickle.dump(_Exploit(marker), handle)
            elif name == "common":
                with open(os.path.join(folder, "common.pt"), "wb") as handle:
                    handle.write(crafted_torch_file(marker))
            elif name == "zarr":
                with open(os.path.join(folder, "metadata.json"), "w", encoding="utf-8") as handle:
                    json.dump({"sharded_backend": "zarr", "sharded_backend_version": 1}, handle)
        dist.barrier()
        attempt(name, folder)
    return results


def test_megatron_folders_are_checked_before_megatron_core_reads_them(pools, tmp_path) -> None:
    marker = str(tmp_path / "ran")
    results = pools(2).run(rank_load_each_variant, str(tmp_path), marker, timeout=120)
    assert results[0] == results[1]  # both processes reach the same verdict
    outcome = results[0]
    assert outcome["good"] == "ok"
    assert outcome["metadata"].startswith("UnsafeCheckpointError") and ".metadata" in outcome["metadata"]
    assert outcome["common"].startswith("UnsafeCheckpointError") and "common.pt" in outcome["common"]
    assert outcome["zarr"].startswith("UnsafeCheckpointError") and "'zarr'" in outcome["zarr"]
    assert "torch_dist" in outcome["zarr"]  # says what would be accepted
    assert not os.path.exists(marker)


def test_a_folder_without_its_backend_record_is_named(tmp_path) -> None:
    from accel_train.checkpoint import megatron_io

    with pytest.raises(FileNotFoundError, match="metadata.json"):
        megatron_io.check_folder(str(tmp_path))
    (tmp_path / "metadata.json").write_text("[1, 2]")
    from accel_state.errors import CorruptCheckpointError

    with pytest.raises(CorruptCheckpointError, match="JSON object"):
        megatron_io.check_folder(str(tmp_path))
