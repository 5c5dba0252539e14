"""accel-bigmodel installed alone: sharded save, disk offload, and reload with part of the model on disk."""

from __future__ import annotations

import os
import tempfile

import torch
from _common import check, installed_distributions
from torch import nn

from accel_bigmodel import disk_offload, init_empty_weights, load_checkpoint_and_dispatch, save_sharded


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))


def main() -> None:
    print("installed:", ", ".join(installed_distributions()))
    torch.manual_seed(0)
    model = make_model().eval()
    inputs = torch.randn(5, 8)
    with torch.no_grad():
        expected = model(inputs)
    with tempfile.TemporaryDirectory() as folder:
        checkpoint = os.path.join(folder, "model")
        files = save_sharded(model.state_dict(), checkpoint, max_shard_size="2KB")
        check(len(files) > 1, f"expected several shards, got {files}")
        check(os.path.isfile(os.path.join(checkpoint, "model.safetensors.index.json")), "no shard index written")

        fresh = make_model().eval()
        fresh.load_state_dict(model.state_dict())
        on_disk = disk_offload(fresh, os.path.join(folder, "offload2"))
        with torch.no_grad():
            check(torch.allclose(on_disk(inputs), expected), "disk_offload changed the outputs")

        with init_empty_weights():
            empty = make_model()
        device_map = {"0": "cpu", "1": "cpu", "2": "disk", "3": "cpu", "4": "disk"}
        reloaded = load_checkpoint_and_dispatch(
            empty, checkpoint, device_map=device_map, offload_folder=os.path.join(folder, "offload3")
        ).eval()
        with torch.no_grad():
            check(torch.allclose(reloaded(inputs), expected), "reload with layers on disk changed the outputs")
    print("accel-bigmodel smoke: sharded save, disk offload, reload with part on disk OK")


if __name__ == "__main__":
    main()
