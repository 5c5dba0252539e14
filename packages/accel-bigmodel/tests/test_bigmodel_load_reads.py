"""The load path reads each shard's index and metadata a bounded number of times, whatever its tensor count.

Every file-system call that reads a checkpoint or offload file (``open``, ``os.open``, ``os.stat``,
``os.lstat``: headers, the index, sizes, link checks, memory maps) is counted per file. A checkpoint of
16 tensors and one of 256, both in two shards, must cost the same calls: a check or read done per tensor
would grow with the second (issue 43: per-tensor work on the load path).
"""

from __future__ import annotations

import builtins
import collections
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from accel_bigmodel.big_modeling import load_checkpoint_and_dispatch
from accel_bigmodel.empty import init_empty_weights
from accel_bigmodel.loading import load_checkpoint_in_model
from accel_bigmodel.sharding import save_sharded


def _net(layers: int) -> nn.Sequential:
    return nn.Sequential(*[nn.Linear(4, 4) for _ in range(layers)])


def _save(folder: Path, layers: int) -> nn.Sequential:
    """A two-shard safetensors checkpoint (sizes and save id in its index) of ``layers`` Linear layers."""
    net = _net(layers)
    total = sum(t.numel() * t.element_size() for t in net.state_dict().values())
    save_sharded(net.state_dict(), folder, max_shard_size=total // 2 + 80)
    shards = sorted(p.name for p in folder.iterdir() if p.suffix == ".safetensors")
    assert len(shards) == 2, shards
    return net


@contextmanager
def _counting(folders: list[Path]) -> Iterator[collections.Counter[tuple[str, str]]]:
    """Count (call, file name) for every open/stat/lstat of a path inside ``folders``."""
    roots = [os.path.realpath(f) for f in folders] + [os.fspath(f) for f in folders]
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    originals = {"open": builtins.open, "os.open": os.open, "os.stat": os.stat, "os.lstat": os.lstat}

    def counted(label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(path: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(path, str | os.PathLike):
                text = os.fspath(path)
                if isinstance(text, str) and any(text.startswith(root) for root in roots):
                    counts[(label, os.path.basename(text))] += 1
            return fn(path, *args, **kwargs)

        return wrapper

    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(builtins, "open", counted("open", originals["open"]))
        mp.setattr(os, "open", counted("os.open", originals["os.open"]))
        mp.setattr(os, "stat", counted("os.stat", originals["os.stat"]))
        mp.setattr(os, "lstat", counted("os.lstat", originals["os.lstat"]))
        yield counts
    finally:
        mp.undo()


def _calls(tmp_path: Path, layers: int, how: str) -> collections.Counter[tuple[str, str]]:
    """The counted calls of one load of a ``layers``-layer checkpoint, done as ``how`` says."""
    folder = tmp_path / f"ckpt{layers}"
    offload = tmp_path / f"off{layers}"
    reference = _save(folder, layers)
    with init_empty_weights():
        model = _net(layers)
    with _counting([folder, offload]) as counts:
        if how == "in_model":
            load_checkpoint_in_model(model, folder, device_map={"": "cpu"})
        elif how == "dispatch":
            load_checkpoint_and_dispatch(model, folder, device_map={"": "cpu"})
        else:  # half the layers on disk
            device_map = {str(i): ("cpu" if i < layers // 2 else "disk") for i in range(layers)}
            load_checkpoint_and_dispatch(model, folder, device_map=device_map, offload_folder=offload)
    on_cpu = [i for i in range(layers) if how != "half_disk" or i < layers // 2]
    for i in on_cpu:  # the load itself worked
        assert torch.equal(model[i].weight, reference[i].weight)
    return counts


@pytest.mark.parametrize("how", ["in_model", "dispatch", "half_disk"])
def test_reads_per_shard_do_not_grow_with_the_tensor_count(tmp_path: Path, how: str) -> None:
    few = _calls(tmp_path, 8, how)  # 16 tensors in 2 shards
    many = _calls(tmp_path, 128, how)  # 256 tensors in 2 shards
    assert sum(few.values()) > 0, "the counting wrappers saw no read: they no longer watch the load path"
    assert sum(many.values()) == sum(few.values()), (
        f"16 tensors: {sorted(few.items())}\n256 tensors: {sorted(many.items())}"
    )
    per_file = collections.Counter(name for (_, name) in many.elements())
    assert max(per_file.values()) <= 12, f"a file is opened or checked too often: {per_file}"
