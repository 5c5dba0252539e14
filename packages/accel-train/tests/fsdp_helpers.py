"""A small block model for the FSDP tests (importable by the rank functions of DistributedPool)."""

from __future__ import annotations

import torch


class Block(torch.nn.Module):
    """One residual MLP block: the unit TRANSFORMER_BASED_WRAP shards."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = torch.nn.Linear(width, 2 * width)
        self.down = torch.nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class BlockNet(torch.nn.Module):
    """Embedding layer, ``depth`` blocks, a head; ``_no_split_modules`` names the block like a HF model."""

    _no_split_modules = ["Block"]

    def __init__(self, width: int = 8, depth: int = 2) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(4, width)
        self.blocks = torch.nn.ModuleList([Block(width) for _ in range(depth)])
        self.head = torch.nn.Linear(width, 1)
        self.register_buffer("scale", torch.ones(1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x) * self.scale


def regression_batches(steps: int, batch: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``steps`` global batches of a fixed regression problem."""
    generator = torch.Generator().manual_seed(seed)
    weights = torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    out = []
    for _ in range(steps):
        x = torch.randn(batch, 4, generator=generator)
        out.append((x, x @ weights + 0.3))
    return out


def mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``mse_loss`` of a (possibly bf16) model output against a float32 target, computed in float32.

    The same numbers as ``mse_loss(output, target)``, whose type promotion casts the output to float32
    first; written out because torch 2.9's CPU ``mse_loss`` backward raises "Found dtype Float but
    expected BFloat16" on mixed dtypes (later releases do not), and the torch-floor session runs these
    tests on 2.9.
    """
    return torch.nn.functional.mse_loss(output.float(), target)


def num_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def local_numel(model: torch.nn.Module) -> int:
    """Parameters this rank holds (the local shard of a DTensor; FSDP1's views are already local)."""
    return sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in model.parameters())


def replace_dcp_item(folder: str, which: str, data: bytes) -> str:
    """Point one item of the DCP folder ``folder`` at ``data`` (appended to its data file), as a crafted
    checkpoint would. ``which``: ``"first"`` (an item of the first data file, which stays in that file) or
    ``"last"`` (the last item of the last data file). Returns the data file's name."""
    import os
    import pickle

    from torch.distributed.checkpoint.filesystem import _StorageInfo

    path = os.path.join(folder, ".metadata")
    with open(path, "rb") as handle:
        metadata = pickle.load(handle)  # the test's own file
    ordered = sorted(metadata.storage_data.items(), key=lambda kv: (str(kv[1].relative_path), kv[1].offset))
    index, info = ordered[0] if which == "first" else ordered[-1]
    data_file = os.path.join(folder, str(info.relative_path))
    offset = os.path.getsize(data_file)
    with open(data_file, "ab") as handle:
        handle.write(data)
    metadata.storage_data[index] = _StorageInfo(info.relative_path, offset, len(data))
    with open(path, "wb") as handle:
        pickle.dump(metadata, handle)
    return str(info.relative_path)


def crafted_torch_file(marker: str) -> bytes:
    """A ``torch.save`` zip whose pickle writes ``marker`` when loaded without ``weights_only``."""
    import io

    class Exploit:
        def __reduce__(self):
            return (exec, (f"open({marker!r}, 'w').write('ran')",))

    buffer = io.BytesIO()
    torch.save({"crafted": Exploit()}, buffer)
    return buffer.getvalue()
