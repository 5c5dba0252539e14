"""Which data-parallel slice a process reads when a device mesh also holds tensor / context parallelism."""

from __future__ import annotations

from typing import Any

# Mesh dimensions over which processes read different data. Tensor- ("tp") and context-parallel ("cp")
# ranks of one data-parallel group read the same batch.
DATA_PARALLEL_DIMS = ("dp", "dp_replicate", "dp_shard")


def data_parallel_coordinates(mesh: Any, num_processes: int, process_index: int) -> tuple[int, int]:
    """``(num_processes, process_index)`` counted over the data-parallel dimensions of ``mesh``.

    Without a mesh the arguments are returned unchanged. A mesh without named dimensions is all data
    parallel; a named mesh without any of ``dp``, ``dp_replicate``, ``dp_shard`` has one data slice.
    """
    if mesh is None:
        return num_processes, process_index
    names = tuple(getattr(mesh, "mesh_dim_names", None) or ())
    if not names:
        coordinate = mesh.get_coordinate() or [0] * mesh.ndim
        index = 0
        for size, position in zip(mesh.shape, coordinate):
            index = index * int(size) + int(position)
        return int(mesh.size()), index
    count, index = 1, 0
    for name in names:
        if name in DATA_PARALLEL_DIMS:
            size = int(mesh[name].size())
            index = index * size + int(mesh.get_local_rank(name))
            count *= size
    return count, index
