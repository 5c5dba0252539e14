"""What a run is, as the plain JSON values the checkpoint's manifest records.

``save_state`` writes these fields into ``accel_checkpoint.json`` and ``load_state`` builds the same ones
for the resuming run, so that both sides of the comparison (`accel_train.checkpoint.resume_diff`) come
from one description. Everything returned is JSON: ints, strings, booleans, lists and dicts.
"""

from __future__ import annotations

import enum
import sys
from collections.abc import Mapping
from typing import Any

__all__ = ["MESH_DIMENSIONS", "data_position", "describe_run", "library_versions", "mesh_sizes", "plain"]

#: The parallel dimensions of `ParallelDims` (and of ``ParallelismConfig``), in mesh order.
MESH_DIMENSIONS = ("dp_replicate", "dp_shard", "tp", "cp", "pp", "ep")

#: Libraries whose version is recorded when the run imported them (a checkpoint may depend on them).
_OPTIONAL_LIBRARIES = ("deepspeed", "transformers")


def plain(value: Any) -> Any:
    """``value`` as a JSON value: enums by name, containers item by item, anything else unknown as text."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, enum.Enum):
        return value.name.lstrip("_")
    if isinstance(value, Mapping):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    return str(value)


def mesh_sizes(dims: Any) -> dict[str, int]:
    """The size of each parallel dimension of ``dims`` (a `ParallelDims`), by name.

    Args:
        dims: the strategy's ``parallel_dims``.
    """
    return {name: int(getattr(dims, f"{name}_size", 1)) for name in MESH_DIMENSIONS}


def library_versions() -> dict[str, str]:
    """The versions of accel-train and torch, and of DeepSpeed and Transformers when this run imported them."""
    from accel_train.__about__ import __version__

    versions = {"accel-train": __version__}
    torch = sys.modules.get("torch")
    if torch is not None:
        versions["torch"] = str(torch.__version__)
    for name in _OPTIONAL_LIBRARIES:
        module = sys.modules.get(name)
        version = getattr(module, "__version__", None) if module is not None else None
        if isinstance(version, str):
            versions[name] = version
    return versions


def data_position(state: Mapping[str, Any], loader: Any) -> dict[str, int | None]:
    """Where a prepared data loader stands, from the state saved for it: its epoch, the batches it yielded
    in that epoch and the samples those make over every process (``None`` where the loader cannot say:
    a loader of unknown global batch size, or a state without these keys).

    Args:
        state: what was saved for the loader (its ``state_dict()``).
        loader: the loader (its ``total_batch_size`` counts the samples of one batch over all processes).
    """
    epoch = state.get("epoch")
    batches = state.get("batches_yielded")
    epoch = epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else None
    batches = batches if isinstance(batches, int) and not isinstance(batches, bool) else None
    try:
        batch_size = getattr(loader, "total_batch_size", None)
    except (TypeError, ValueError, AttributeError):  # a loader without a batch size (batch_sampler=None ...)
        batch_size = None
    samples = batches * batch_size if isinstance(batch_size, int) and batches is not None else None
    return {"epoch": epoch, "batches_yielded": batches, "samples_seen": samples}


def describe_run(*, num_processes: int, strategy: Any, mixed_precision: Any, accumulation_steps: int) -> dict[str, Any]:
    """The fields of the manifest that say what a run is (those a resume compares).

    Args:
        num_processes: the world size.
        strategy: the run's strategy (its ``name``, ``parallel_dims`` and ``checkpoint_settings()``).
        mixed_precision: the precision mode (``"no"``, ``"bf16"`` ... or its enum).
        accumulation_steps: the steps gradients are accumulated over.
    """
    precision = getattr(mixed_precision, "value", mixed_precision)
    return {
        "num_processes": int(num_processes),
        "strategy": str(strategy.name),
        "backend_settings": plain(strategy.checkpoint_settings()),
        "mesh": mesh_sizes(strategy.parallel_dims),
        "mixed_precision": str(precision),
        "gradient_accumulation": {"steps": int(accumulation_steps)},
        "versions": library_versions(),
    }
