"""Driver for the SIGKILL tests (run as its own process): a save over an earlier one, killed at the k-th
file-system step for k = 1, 2, ... until a save completes; after each kill the folder must load as the
earlier state or the new one, exactly, never a mix. Prints one JSON line of results.

Usage: ``python kill_during_save.py save_state|merge <work folder>``. Each save runs in a forked child
that SIGKILLs itself at step k (a step: a file written, a folder renamed, swapped or removed).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fsdp_helpers import BlockNet

from accel_state.testing import reset_shared_state

OLD, NEW = 1.0, 2.0


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


def _install_killer(kill_at: int) -> None:
    """Count every file-system step of a save; SIGKILL this process at step ``kill_at``."""
    import safetensors.torch
    import torch.distributed.checkpoint as dcp

    from accel_train import checkpoint_io, checkpointing

    count = [0]

    def tick() -> None:
        count[0] += 1
        if count[0] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    def wrap(owner: Any, name: str) -> None:
        original = getattr(owner, name)

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            tick()
            result = original(*args, **kwargs)
            tick()
            return result

        setattr(owner, name, wrapped)

    for owner, name in [
        (checkpoint_io, "save_torch"),
        (checkpoint_io, "save_weights"),
        (checkpoint_io, "save_rng"),
        (checkpoint_io, "write_manifest"),
        (checkpointing, "_exchange"),
        (dcp, "save"),
        (safetensors.torch, "save_file"),
        (os, "rename"),
        (os, "replace"),
        (shutil, "rmtree"),
    ]:
        wrap(owner, name)


def _run_killed(kill_at: int, action: Any) -> bool:
    """Run ``action`` in a forked child killed at step ``kill_at``; True when it was killed."""
    pid = os.fork()
    if pid == 0:
        try:
            _install_killer(kill_at)
            action()
        except BaseException as error:  # pragma: no cover - reported through the exit code
            print("child error", error, file=sys.stderr)
            os._exit(3)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return True
    if os.WEXITSTATUS(status) != 0:
        raise RuntimeError(f"the save at kill point {kill_at} failed with exit code {os.WEXITSTATUS(status)}")
    return False


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
    from accel_train.checkpoint_io import load_weights

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
    if mode == "merge":
        from accel_train import merge_fsdp_weights

        sharded_old = os.path.join(pristine, "pytorch_model_fsdp_0")
        new_dir = os.path.join(work, "new")
        accelerator, _, _ = _prepared(NEW)
        accelerator.save_state(new_dir)
        merged_old = os.path.join(work, "merged_pristine")
        merge_fsdp_weights(sharded_old, merged_old, max_shard_size="6KB")
        pristine, target = merged_old, os.path.join(work, "merged")

        def action() -> None:
            merge_fsdp_weights(os.path.join(new_dir, "pytorch_model_fsdp_0"), target, max_shard_size="6KB")

        classify = _classify_merge
    else:

        def action() -> None:
            accelerator, _, _ = _prepared(NEW)
            accelerator.save_state(target)

        classify = _classify_state
    results = []
    for kill_at in range(1, 400):
        if os.path.exists(target):
            shutil.rmtree(target)
        shutil.copytree(pristine, target)
        killed = _run_killed(kill_at, action)
        outcome = classify(target)
        results.append({"kill_at": kill_at, "killed": killed, "outcome": outcome})
        if not killed:
            break
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
