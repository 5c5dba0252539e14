"""Driver for the SIGKILL tests (run as its own process): a save over an earlier one, killed at its k-th
file-system step (a file written, a folder renamed, swapped or removed); after each kill the folder must
load as the earlier state or the new one, exactly, never a mix. Prints one JSON line of results.

Usage: ``python kill_during_save.py save_state|merge <work folder>``. A counting run names every step;
then each chosen step k is a fresh interpreter (``child``) that saves over its own copy of the earlier
save and SIGKILLs itself at step k, two at a time; the driver then loads each copy. The points are
``accel_state.kill_points.choose_kill_points``: every commit step and its neighbours and a spread of the
rest, or every step with ``ACCEL_KILL_POINTS=all``. No process here is forked from one that ran torch.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fsdp_helpers import BlockNet

from accel_state.kill_points import StepCounter, choose_kill_points, die_with_parent, run_kill_points
from accel_state.testing import reset_shared_state

OLD, NEW = 1.0, 2.0
#: What the kill-point zygote imports once, before it forks a child per point.
PRELOAD = ("torch", "torch.distributed.checkpoint", "safetensors.torch", "accel_train", "fsdp_helpers")


def _accelerator() -> Any:
    reset_shared_state()
    from accel_train import Accelerator, FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type="SHARDED_STATE_DICT")
    return Accelerator(cpu=True, fsdp_plugin=plugin)


def _prepared(value: float) -> tuple[Any, Any, Any]:
    accelerator = _accelerator()
    torch.manual_seed(0)
    model = BlockNet(width=16, depth=3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(value)
        for state in optimizer.optimizer.state.values():
            state["exp_avg"].fill_(value)
    return accelerator, model, optimizer


def _install_killer(counter: StepCounter) -> None:
    """Count every file-system step of a save with ``counter`` (which kills this process at its step)."""
    import safetensors.torch
    import torch.distributed.checkpoint as dcp

    from accel_train.checkpoint import file_io as checkpoint_io
    from accel_train.checkpoint import folder

    for owner, name in [
        (checkpoint_io, "save_torch"),
        (checkpoint_io, "save_weights"),
        (checkpoint_io, "save_rng"),
        (checkpoint_io, "write_manifest"),
        (folder, "_exchange"),
        (dcp, "save"),
        (safetensors.torch, "save_file"),
        (os, "rename"),
        (os, "replace"),
        (shutil, "rmtree"),
    ]:
        counter.wrap(owner, name)


def _action(mode: str, work: str, target: str) -> Callable[[], Any]:
    """The save a child runs over ``target``: a new ``save_state``, or a merge of the new shards."""
    if mode == "merge":
        from accel_train import merge_fsdp_weights

        new_shards = os.path.join(work, "new", "pytorch_model_fsdp_0")
        return lambda: merge_fsdp_weights(new_shards, target, max_shard_size="6KB")

    def save() -> None:
        accelerator, _, _ = _prepared(NEW)
        accelerator.save_state(target)

    return save


def child(mode: str, work: str, target: str, kill_at: int, log: str) -> None:
    """One fresh process: the save over ``target``, SIGKILLed at step ``kill_at`` (0: count, log labels)."""
    die_with_parent()
    counter = StepCounter(kill_at, log)
    action = _action(mode, work, target)
    _install_killer(counter)
    action()


def _classify_state(folder: str) -> str:
    accelerator, model, optimizer = _prepared(0.0)
    accelerator.load_state(folder)
    values = {float(v) for p in model.parameters() for v in p.detach().flatten().unique()}
    values |= {float(v) for s in optimizer.optimizer.state.values() for v in s["exp_avg"].flatten().unique()}
    if values == {OLD}:
        return "old"
    if values == {NEW}:
        return "new"
    return f"mix {sorted(values)}"


def _classify_merge(output: str) -> str:
    from accel_train.checkpoint.file_io import load_weights

    index_path = os.path.join(output, "model.safetensors.index.json")
    with open(index_path, encoding="utf-8") as handle:
        index = json.load(handle)
    files = sorted(set(index["weight_map"].values()))
    present = sorted(name for name in os.listdir(output) if name.endswith(".safetensors"))
    if files != present:
        return f"index names {files}, folder holds {present}"
    values: set[float] = set()
    for name in files:
        for tensor in load_weights(os.path.join(output, name)).values():
            values |= {float(v) for v in tensor.flatten().unique()}
    return {frozenset({OLD}): "old", frozenset({NEW}): "new"}.get(frozenset(values), f"mix {sorted(values)}")


def main(mode: str, work: str) -> None:
    pristine = os.path.join(work, "pristine")
    target = os.path.join(work, "ckpt")
    accelerator, _, _ = _prepared(OLD)
    accelerator.save_state(pristine)
    classify = _classify_state
    if mode == "merge":
        from accel_train import merge_fsdp_weights

        accelerator, _, _ = _prepared(NEW)
        accelerator.save_state(os.path.join(work, "new"))
        merged_old = os.path.join(work, "merged_pristine")
        merge_fsdp_weights(os.path.join(pristine, "pytorch_model_fsdp_0"), merged_old, max_shard_size="6KB")
        pristine, target = merged_old, os.path.join(work, "merged")
        classify = _classify_merge
    log = os.path.join(work, "steps.txt")

    def command(kill_at: int) -> list[str]:
        folder = f"{target}-{kill_at}"  # each point saves over its own copy of the earlier save
        if os.path.exists(folder):
            shutil.rmtree(folder)
        shutil.copytree(pristine, folder)
        return [sys.executable, os.path.abspath(__file__), "child", mode, work, folder, str(kill_at), log]

    run_kill_points(command, [0], preload=PRELOAD)  # the counting run: every step's label, one a line
    with open(log, encoding="utf-8") as handle:
        labels = handle.read().splitlines()
    points = [*choose_kill_points(labels), len(labels) + 1]  # the last point is past the end: a whole save
    killed = run_kill_points(command, points, preload=PRELOAD)
    results = []
    for kill_at in points:
        step = labels[kill_at - 1] if kill_at <= len(labels) else "none (the save completes)"
        results.append(
            {"kill_at": kill_at, "step": step, "killed": killed[kill_at], "outcome": classify(f"{target}-{kill_at}")}
        )
    print(json.dumps({"steps": len(labels), "points": results}))


if __name__ == "__main__":
    if sys.argv[1] == "child":
        child(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6])
    else:
        main(sys.argv[1], sys.argv[2])
