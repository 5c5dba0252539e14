"""Pipeline-parallel inference on ``torch.distributed.pipelining``: each process runs one stage of the model.

``prepare_pippy`` splits the model at ``split_points`` (or evenly by size with "auto"), traces it
with example inputs, builds this rank's stage and a GPipe schedule, and replaces ``model.forward``:
rank 0 feeds the inputs, the last rank gets the outputs (every rank with ``gather_output``).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

from accel_bigmodel.planning import infer_auto_device_map
from accel_bigmodel.sizes import calculate_maximum_sizes
from accel_state.nested import send_to_device
from accel_state.operations import pad_input_tensors
from accel_state.state import PartialState


def generate_device_map(
    model: nn.Module,
    num_processes: int = 1,
    no_split_module_classes: list[str] | None = None,
    max_memory: dict[Any, Any] | None = None,
) -> dict[str, Any]:
    """A map that spreads ``model`` evenly by size over ``num_processes`` stages (keys 0..n-1)."""
    if max_memory is None:
        total, (largest, _) = calculate_maximum_sizes(model)
        share = total // num_processes + largest
        max_memory = {i: share for i in range(num_processes)}
    return infer_auto_device_map(
        model, max_memory=max_memory, no_split_module_classes=no_split_module_classes, clean_result=False
    )


def _split_points_from(device_map: dict[str, Any], num_processes: int) -> list[str]:
    points = []
    seen = set()
    for name, device in device_map.items():
        if device not in seen:
            seen.add(device)
            if device != 0:
                points.append(name)
    if len(points) != num_processes - 1:
        raise ValueError(
            f"Could not split the model into {num_processes} stages (got {len(points) + 1}): pass split_points "
            "explicitly, e.g. the names of the layers that start each stage."
        )
    return points


def find_pippy_batch_size(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    """Size of the first dimension of the first tensor in ``args`` then ``kwargs``."""
    for value in list(args) + list(kwargs.values()):
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return int(value.shape[0])
    return None


def _micro(value: Any, num_chunks: int) -> Any:
    if isinstance(value, torch.Tensor) and value.dim() > 0:
        return value.tensor_split(num_chunks)[0]
    return value


def build_pipeline(
    model: nn.Module, split_points: list[str], args: tuple[Any, ...], kwargs: dict[str, Any], num_chunks: int
) -> Any:
    """This rank's pipeline schedule for ``model`` split before each name of ``split_points``."""
    from torch.distributed.pipelining import ScheduleGPipe, SplitPoint, pipeline

    state = PartialState()
    split_spec = {point: SplitPoint.BEGINNING for point in split_points}
    mb_args = tuple(_micro(a, num_chunks) for a in args)
    mb_kwargs = {k: _micro(v, num_chunks) for k, v in kwargs.items()}
    pipe = pipeline(model, mb_args=mb_args, mb_kwargs=mb_kwargs or None, split_spec=split_spec)
    stage = pipe.build_stage(state.local_process_index, device=state.device)
    match_init_p2p_dtypes(stage)
    return ScheduleGPipe(stage, num_chunks)


def match_init_p2p_dtypes(stage: Any) -> Any:
    """Make ``stage``'s first neighbour exchange send what its neighbours receive (float32).

    Before a schedule's first step each stage sends its index to its neighbours and receives theirs
    (``_get_init_p2p_neighbors_ops``). Some torch releases (2.9) send an int64 tensor into a float32
    receive buffer: NCCL copies the bytes, gloo aborts the process ("Received data size doesn't match
    expected size. 8 vs 4"). Later releases send float32. The wrapper casts each tensor of that exchange to
    float32, so it changes nothing where torch already does; a stage without the method is left as it is.
    """
    original = getattr(stage, "_get_init_p2p_neighbors_ops", None)
    if original is None:
        return stage

    @functools.wraps(original)
    def matched() -> list[Any]:
        ops = original()
        for op in ops:
            tensor = getattr(op, "tensor", None)
            if isinstance(tensor, torch.Tensor) and tensor.dtype != torch.float32:
                op.tensor = tensor.float()  # a dummy value: only its size must match the other side
        return ops

    stage._get_init_p2p_neighbors_ops = matched
    return stage


def pippy_forward(forward: Any, num_chunks: int, gather_output: bool, *args: Any, **kwargs: Any) -> Any:
    """Run one pipelined forward: rank 0 feeds inputs, the last rank returns outputs."""
    state = PartialState()
    output = None
    if state.num_processes == 1:
        output = forward(*args, **kwargs)
    elif state.is_local_main_process and state.process_index == 0:
        batch = find_pippy_batch_size(args, kwargs)
        if batch is not None and batch % num_chunks != 0:
            args = tuple(pad_input_tensors(a, batch, num_chunks) for a in args)
            kwargs = {k: pad_input_tensors(v, batch, num_chunks) for k, v in kwargs.items()}
        forward(*args, **kwargs)
    elif state.is_last_process:
        output = forward()
    else:
        forward()
    if gather_output and state.num_processes > 1:
        from accel_state import kept_works

        holder = [output.cpu() if isinstance(output, torch.Tensor) else output]
        kept_works.broadcast_object_list(holder, src=state.num_processes - 1)
        output = send_to_device(holder[0], state.device)
    return output


def prepare_pippy(
    model: nn.Module,
    split_points: str | list[str] | None = "auto",
    no_split_module_classes: list[str] | None = None,
    example_args: tuple[Any, ...] | None = (),
    example_kwargs: dict[str, Any] | None = None,
    num_chunks: int | None = None,
    gather_output: bool | None = False,
) -> nn.Module:
    """Wrap ``model`` for pipeline-parallel inference across the processes of the current launch.

    ``example_args``/``example_kwargs`` are one full batch (its first dimension must divide into
    ``num_chunks`` micro-batches, default: the number of processes).

    Args:
        model: The model (an `nn.Module`).
        split_points: Module names the model is split before, or `"auto"` to split it evenly.
        no_split_module_classes: Class names of modules that must stay whole on one device (for example a
            transformer block).
        example_args: Example positional inputs used to trace the model.
        example_kwargs: Example keyword inputs used to trace the model.
        num_chunks: Number of micro-batches a batch is split into; `None` uses the number of processes.
        gather_output: Send the last stage's output to every process.
    """
    state = PartialState()
    example_args = send_to_device(tuple(example_args or ()), "cpu")
    example_kwargs = send_to_device(dict(example_kwargs or {}), "cpu")
    if not example_args and not example_kwargs:
        raise ValueError(
            "prepare_pippy needs example_args or example_kwargs: one batch of inputs to trace the model with."
        )
    if num_chunks is None:
        num_chunks = state.num_processes
    if num_chunks < 1:
        raise ValueError(f"num_chunks must be at least 1, got {num_chunks}.")
    if split_points == "auto" or split_points is None:
        device_map = generate_device_map(model, state.num_processes, no_split_module_classes=no_split_module_classes)
        split_points = _split_points_from(device_map, state.num_processes)
    elif isinstance(split_points, str):
        split_points = [split_points]
    known = {name for name, _ in model.named_modules()}
    unknown = [p for p in split_points if p not in known]
    if unknown:
        raise ValueError(f"split_points names modules the model does not have: {unknown}.")
    if len(split_points) != state.num_processes - 1:
        raise ValueError(
            f"{len(split_points)} split points make {len(split_points) + 1} stages but there are "
            f"{state.num_processes} processes: give {state.num_processes - 1} split points."
        )
    schedule = build_pipeline(model, list(split_points), example_args, example_kwargs, num_chunks)
    model._original_forward = model.forward  # type: ignore[assignment]
    model._original_call = model.__call__  # type: ignore[assignment]
    model.pippy_stage = schedule  # type: ignore[assignment]
    model.hf_split_points = list(split_points)  # type: ignore[assignment]
    model.forward = functools.partial(pippy_forward, schedule.step, num_chunks, bool(gather_output))  # type: ignore[method-assign]
    return model
