"""State dicts of FSDP models and their optimizers: full (gathered) or sharded through DCP.

Every function here is collective when the model is sharded: call it on every rank. The same code
serves FSDP1, FSDP2 and a model left unwrapped (one process), through
``torch.distributed.checkpoint.state_dict``. Sharded checkpoints are ``torch.distributed.checkpoint``
folders holding ``{"model": state_dict}`` or ``{"optimizer": state_dict}`` (the documented layout:
``pytorch_model_fsdp_0/`` and ``optimizer_0/``), readable on any number of processes (DCP reshards).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Collection, Iterator, Mapping
from typing import Any

import torch

__all__ = [
    "MODEL_KEY",
    "OPTIMIZER_KEY",
    "check_shapes",
    "full_model_state_dict",
    "full_optimizer_state_dict",
    "load_full_model_state_dict",
    "load_full_optimizer_state_dict",
    "load_sharded_model",
    "load_sharded_optimizer",
    "model_shapes",
    "saved_shapes",
    "save_sharded_model",
    "save_sharded_optimizer",
]

MODEL_KEY = "model"
OPTIMIZER_KEY = "optimizer"


def _options(**kwargs: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(**kwargs)


def _is_fsdp1(model: torch.nn.Module) -> bool:
    return type(model).__name__ == "FullyShardedDataParallel"


@contextlib.contextmanager
def _local_state_dict(model: torch.nn.Module, local: bool) -> Iterator[None]:
    """FSDP1's LOCAL_STATE_DICT (each rank's flat shards) inside the block, when asked."""
    if not (local and _is_fsdp1(model)):
        yield
        return
    from torch.distributed.fsdp import FullyShardedDataParallel, StateDictType

    with FullyShardedDataParallel.state_dict_type(model, StateDictType.LOCAL_STATE_DICT):
        yield


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_cpu(v) for v in value]
    return value


# -- full state dicts ------------------------------------------------------------------------------


def full_model_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's state dict on every rank, on the CPU (gathered from the shards).

    Gathered without ``cpu_offload`` (FSDP1 crashes with it on CPU, and with it only rank 0 would
    get the tensors); each tensor is then moved to the CPU.
    """
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    state: dict[str, Any] = get_model_state_dict(model, options=_options(full_state_dict=True, cpu_offload=False))
    return {name: t.detach().cpu() if isinstance(t, torch.Tensor) else t for name, t in state.items()}


def load_full_model_state_dict(
    model: torch.nn.Module,
    state_dict: Mapping[str, torch.Tensor],
    strict: bool = True,
    broadcast_from_rank0: bool = False,
    source: str = "the state dict",
) -> None:
    """Load a full state dict into a (sharded) model; with ``broadcast_from_rank0`` only rank 0's
    tensors are read and the other ranks receive them. Shapes are checked first (tensors named)."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    if not broadcast_from_rank0 or _rank() == 0:
        check_shapes(model_shapes(model), {k: tuple(v.shape) for k, v in state_dict.items()}, source)
    result = set_model_state_dict(
        model,
        dict(state_dict),
        options=_options(full_state_dict=True, strict=False, broadcast_from_rank0=broadcast_from_rank0),
    )
    _check_keys(model, result, strict, source)


#: what bitsandbytes adds to a state dict after a 4-bit weight's name ("<weight>.absmax", ...)
QUANT_STATE_PARTS = ("absmax", "quant_map", "nested_absmax", "nested_quant_map")


def is_quant_state_key(key: str) -> bool:
    """True for the entries bitsandbytes saves beside a 4-bit weight (its quantization statistics, which
    the loaded model's quantized layer already holds): not an unexpected key of a QLoRA model."""
    last = key.rsplit(".", 2)
    return last[-1] in QUANT_STATE_PARTS or (len(last) == 3 and last[-2] == "quant_state")


def _check_keys(model: torch.nn.Module, result: Any, strict: bool, source: str) -> None:
    if not strict or result is None:
        return
    missing = list(getattr(result, "missing_keys", []))
    unexpected = [key for key in getattr(result, "unexpected_keys", []) if not is_quant_state_key(key)]
    if missing or unexpected:
        raise RuntimeError(
            f"{source} does not match the model {type(model).__name__}: missing keys {missing}, "
            f"unexpected keys {unexpected}"
        )


def full_optimizer_state_dict(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's whole state (keyed by parameter names) on every rank, on the CPU."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    state = get_optimizer_state_dict(model, optimizer, options=_options(full_state_dict=True, cpu_offload=False))
    return _to_cpu(state)  # type: ignore[no-any-return]


def load_full_optimizer_state_dict(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]
) -> None:
    """Load a full optimizer state dict (from `full_optimizer_state_dict()`) into the sharded optimizer."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    with _no_grads(optimizer):
        set_optimizer_state_dict(model, optimizer, state_dict, options=_options(full_state_dict=True))


@contextlib.contextmanager
def _no_grads(optimizer: torch.optim.Optimizer) -> Iterator[None]:
    """Hide the gradients of an optimizer without state, so that torch creates its state (a step with
    zero gradients and zero learning rate) before loading into it; the gradients come back after."""
    if optimizer.state:
        yield
        return
    params = [p for group in optimizer.param_groups for p in group["params"]]
    grads = [p.grad for p in params]
    for p in params:
        p.grad = None
    try:
        yield
    finally:
        for p, grad in zip(params, grads):
            p.grad = grad


# -- shapes ------------------------------------------------------------------------------------------


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def model_shapes(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    """``{name: global shape}`` of the model's state dict (shards report the whole tensor's shape)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    state = get_model_state_dict(model)
    return {name: tuple(t.shape) for name, t in state.items() if isinstance(t, torch.Tensor)}


def _io(io: Any) -> Any:
    """The checkpoint I/O that reads and writes the DCP folders (the strategy's, or a default one)."""
    if io is not None:
        return io
    from accel_train.checkpoint.file_io import CheckpointIO

    return CheckpointIO()


def saved_shapes(checkpoint_dir: str, key: str = MODEL_KEY, io: Any = None) -> dict[str, tuple[int, ...]]:
    """``{name: shape}`` of the tensors of a DCP folder (under ``key``, the prefix removed)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = _io(io).sharded_metadata(checkpoint_dir)
    prefix = f"{key}."
    shapes = {}
    for name, item in metadata.state_dict_metadata.items():
        if isinstance(item, TensorStorageMetadata):
            shapes[name[len(prefix) :] if name.startswith(prefix) else name] = tuple(item.size)
    return shapes


def check_shapes(expected: Mapping[str, tuple[int, ...]], found: Mapping[str, tuple[int, ...]], source: str) -> None:
    """Raise ``ValueError`` naming every tensor whose shape in ``found`` differs from the model's."""
    wrong = [
        f"{name}: checkpoint {tuple(found[name])}, model {tuple(shape)}"
        for name, shape in expected.items()
        if name in found and tuple(found[name]) != tuple(shape)
    ]
    if wrong:
        raise ValueError(f"{source} does not fit the model: tensors of another shape: " + "; ".join(wrong))


# -- sharded (DCP) checkpoints ---------------------------------------------------------------------------


def save_sharded_model(model: torch.nn.Module, checkpoint_dir: str, local: bool = False, io: Any = None) -> None:
    """Write each rank's shards of the model into the DCP folder ``checkpoint_dir`` (collective).

    ``io`` is the `CheckpointIO` that writes the folder.
    """
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    from accel_train.checkpoint.file_io import writing

    with writing(checkpoint_dir):
        os.makedirs(checkpoint_dir, exist_ok=True)
    if local and _is_fsdp1(model):
        _save_local(model, checkpoint_dir)
        return
    _io(io).save_sharded({MODEL_KEY: get_model_state_dict(model)}, checkpoint_dir)


def load_sharded_model(
    model: torch.nn.Module,
    checkpoint_dir: str,
    strict: bool = True,
    local: bool = False,
    io: Any = None,
    elsewhere: Collection[str] = (),
) -> None:
    """Read the DCP folder ``checkpoint_dir`` into the (sharded) model, on any number of processes.

    Tensors whose saved shape differs from the model's are named before anything is read. ``elsewhere``
    names saved tensors that other processes hold and this one does not (listed experts under expert
    parallelism): not unexpected.
    """
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    written_local = not os.path.isfile(os.path.join(checkpoint_dir, ".metadata")) and any(
        name.startswith("rank") and name.endswith(".safetensors") for name in os.listdir(checkpoint_dir)
    )
    if (local and _is_fsdp1(model)) or written_local:  # a LOCAL_STATE_DICT folder names its number of processes
        _load_local(model, checkpoint_dir)
        return
    if not os.path.isfile(os.path.join(checkpoint_dir, ".metadata")):
        raise FileNotFoundError(f"{checkpoint_dir} is not a torch.distributed.checkpoint folder (no .metadata)")
    saved = saved_shapes(checkpoint_dir, io=io)
    state = get_model_state_dict(model)
    shapes = {name: tuple(t.shape) for name, t in state.items() if isinstance(t, torch.Tensor)}
    check_shapes(shapes, saved, f"sharded checkpoint {checkpoint_dir}")
    if strict:
        missing = sorted(set(state) - set(saved))
        extra = sorted(set(saved) - set(state) - set(elsewhere))
        if missing or extra:
            raise RuntimeError(
                f"sharded checkpoint {checkpoint_dir} does not match the model {type(model).__name__}: "
                f"missing keys {missing}, unexpected keys {extra}"
            )
    else:
        state = {k: v for k, v in state.items() if k in saved}
    _io(io).load_sharded({MODEL_KEY: state}, checkpoint_dir)
    set_model_state_dict(model, state, options=_options(strict=False))


def save_sharded_optimizer(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, checkpoint_dir: str, io: Any = None
) -> None:
    """Write each rank's shards of the optimizer state into the DCP folder ``checkpoint_dir`` (collective)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    _io(io).save_sharded({OPTIMIZER_KEY: get_optimizer_state_dict(model, optimizer)}, checkpoint_dir)


def load_sharded_optimizer(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, checkpoint_dir: str, io: Any = None
) -> None:
    """Read the DCP folder ``checkpoint_dir`` into the optimizer of the (sharded) model."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    if not os.path.isfile(os.path.join(checkpoint_dir, ".metadata")):
        raise FileNotFoundError(f"{checkpoint_dir} is not a torch.distributed.checkpoint folder (no .metadata)")
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    with _no_grads(optimizer):
        state = {OPTIMIZER_KEY: get_optimizer_state_dict(model, optimizer)}
    _io(io).load_sharded(state, checkpoint_dir, planner=DefaultLoadPlanner(flatten_sharded_tensors=False))
    set_optimizer_state_dict(model, optimizer, state[OPTIMIZER_KEY])


# -- FSDP1 LOCAL_STATE_DICT: each rank's flat shards, one file per rank --------------------------------


def _world() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _local_tensor(value: Any) -> Any:
    if hasattr(value, "local_shards"):
        shards = value.local_shards()
        return shards[0].tensor if shards else torch.empty(0)
    return value


def _save_local(model: torch.nn.Module, checkpoint_dir: str) -> None:
    from accel_train.checkpoint.file_io import save_shard

    with _local_state_dict(model, True):
        state = {k: _local_tensor(v).detach().cpu().contiguous().clone() for k, v in model.state_dict().items()}
    save_shard(state, os.path.join(checkpoint_dir, f"rank{_rank()}.safetensors"), {"world_size": str(_world())})


def _load_local(model: torch.nn.Module, checkpoint_dir: str) -> None:
    from accel_train.checkpoint.file_io import read_shard

    path = os.path.join(checkpoint_dir, f"rank{_rank()}.safetensors")
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{checkpoint_dir} holds no LOCAL_STATE_DICT shard for rank {_rank()} ({path}); it was written by "
            "another number of processes or with another state_dict_type"
        )
    metadata, saved = read_shard(path)
    saved_world = int(metadata.get("world_size", "0"))
    if saved_world != _world():
        raise ValueError(
            f"{checkpoint_dir} is a LOCAL_STATE_DICT checkpoint of {saved_world} processes; it loads only on the "
            f"same number (here {_world()}). Save with SHARDED_STATE_DICT to change the number of processes."
        )
    with _local_state_dict(model, True):
        current = model.state_dict()
        for name, value in current.items():
            if name not in saved:
                raise RuntimeError(f"{path} has no tensor {name!r} of the model")
            target = _local_tensor(value)
            if tuple(target.shape) != tuple(saved[name].shape):
                raise ValueError(
                    f"{path}: tensor {name} has shape {tuple(saved[name].shape)}, the model's shard {tuple(target.shape)}"
                )
            with torch.no_grad():
                target.copy_(saved[name])  # the local shard is a view of the flat parameter: loaded in place
