"""The one place accel builds a ``torch.distributed`` device mesh.

Every strategy that spreads a model over named dimensions (FSDP's data-parallel shards and replicas, the
ND strategy's ``dp_replicate`` x ``dp_shard`` x ``cp`` x ``tp``, the pipeline's stages) asks here, so the
sizes are checked against the process group once, with one error, and flattened sub-meshes (``dp``,
``dp_shard_cp`` ...) are registered the same way everywhere.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

__all__ = ["build_mesh"]


def build_mesh(
    device_type: str,
    dims: Sequence[tuple[str, int]],
    flattened: Mapping[str, Sequence[str]] | None = None,
    flat_meshes: MutableMapping[str, Any] | None = None,
) -> Any:
    """The ``DeviceMesh`` of ``dims`` over every process of the default group.

    Args:
        device_type: device type of the mesh (``cpu``, ``cuda`` ...).
        dims: ``(name, size)`` of each dimension, outermost first; sizes multiply to the world size.
        flattened: name -> the dimensions joined into one sub-mesh registered under that name (each
            listed dimension must be in ``dims``).
        flat_meshes: filled with name -> each flattened sub-mesh, for code that uses one (torch deprecates
            slicing a flattened dimension from the root mesh; a script's ``mesh["dp_cp"]`` still works).

    Raises:
        ValueError: a size below 1, a name given twice, sizes that do not multiply to the number of
            processes, or a flattened sub-mesh of a dimension not in ``dims``.
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    names = [name for name, _ in dims]
    sizes = [int(size) for _, size in dims]
    if len(set(names)) != len(names):
        raise ValueError(f"device mesh dimensions must have distinct names, got {names}")
    if any(size < 1 for size in sizes):
        raise ValueError(f"device mesh sizes must be >= 1, got {dict(zip(names, sizes))}")
    total = 1
    for size in sizes:
        total *= size
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if total != world:
        shown = " x ".join(f"{name} {size}" for name, size in zip(names, sizes))
        raise ValueError(f"a device mesh of {shown} needs {total} processes, but the run has {world}")
    for flat, parts in (flattened or {}).items():
        missing = [part for part in parts if part not in names]
        if missing:
            raise ValueError(f"cannot flatten {missing} into {flat!r}: the mesh has only {names}")
    mesh = init_device_mesh(device_type, tuple(sizes), mesh_dim_names=tuple(names))
    for flat, parts in (flattened or {}).items():
        if parts:
            flat_mesh = mesh[tuple(parts)]._flatten(flat)
            if flat_meshes is not None:
                flat_meshes[flat] = flat_mesh
    return mesh
