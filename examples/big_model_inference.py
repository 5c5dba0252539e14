"""Run a model that does not fit in the memory you give it: part in memory, part on disk.

    python examples/big_model_inference.py                       # a small model, 40% of it in memory
    python examples/big_model_inference.py --depth 24 --width 512 --memory_fraction 0.25

What it does, in order: builds a small transformer-like model and saves it as sharded safetensors
(standing in for a downloaded checkpoint); builds the same architecture again without weights
(``init_empty_weights``); plans where each block goes under a memory budget smaller than the model
(``infer_auto_device_map``) and prints the plan as a picture; loads the checkpoint straight into
that plan with the rest left on disk (``load_checkpoint_and_dispatch``; weights of a safetensors
checkpoint are read in place, other formats are copied to ``offload_folder``); generates a few
tokens greedily and checks every output against the model held fully in memory.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import torch
from torch import nn

from accel_bigmodel import (
    compute_module_sizes,
    infer_auto_device_map,
    init_empty_weights,
    load_checkpoint_and_dispatch,
    save_sharded,
)


class Block(nn.Module):
    """Pre-norm residual block: a token-mixing linear layer and an MLP (kept whole on one device)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mix = nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.mix(self.norm(x))
        return x + self.mlp(self.norm(x))


class TinyLM(nn.Module):
    """Embedding, ``depth`` blocks, an output head: the shape of a language model, at toy size."""

    def __init__(self, vocab: int, width: int, depth: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output_dir", default=os.path.join(tempfile.gettempdir(), "accel_big_model"))
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument(
        "--memory_fraction", type=float, default=0.4, help="share of the model's size allowed in CPU memory"
    )
    parser.add_argument("--new_tokens", type=int, default=8)
    return parser.parse_args()


def picture(device_map: dict[str, object]) -> str:
    """One line per device: which modules sit there."""
    devices: dict[object, list[str]] = {}
    for name, device in device_map.items():
        devices.setdefault(device, []).append(name)
    return "\n".join(f"  {device!s:6} | {' '.join(names)}" for device, names in devices.items())


def generate(model: nn.Module, ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy decoding: append the most likely next token ``new_tokens`` times."""
    with torch.no_grad():
        for _ in range(new_tokens):
            next_token = model(ids)[:, -1].argmax(dim=-1, keepdim=True)
            ids = torch.cat([ids, next_token], dim=1)
    return ids


def main() -> None:
    args = parse_args()
    checkpoint = os.path.join(args.output_dir, "checkpoint")
    offload = os.path.join(args.output_dir, "offload")
    os.makedirs(args.output_dir, exist_ok=True)

    torch.manual_seed(0)
    reference = TinyLM(args.vocab, args.width, args.depth).eval()
    save_sharded(reference.state_dict(), checkpoint, max_shard_size="1MB")
    shards = sorted(f for f in os.listdir(checkpoint) if f.endswith(".safetensors"))
    print(f"checkpoint: {len(shards)} safetensors shards + index in {checkpoint}")

    with init_empty_weights():
        model = TinyLM(args.vocab, args.width, args.depth)
    total = compute_module_sizes(model)[""]
    budget = int(total * args.memory_fraction)
    device_map = infer_auto_device_map(model, max_memory={"cpu": budget}, no_split_module_classes=["Block"])
    print(f"model {total / 1e6:.2f} MB, memory budget {budget / 1e6:.2f} MB; the plan:")
    print(picture(device_map))

    start = time.perf_counter()
    model = load_checkpoint_and_dispatch(
        model, checkpoint, device_map=device_map, no_split_module_classes=["Block"], offload_folder=offload
    )
    on_disk = [name for name, device in device_map.items() if device == "disk"]
    if not on_disk:
        raise SystemExit("nothing was offloaded: lower --memory_fraction")
    index_path = os.path.join(offload, "index.json")
    index = {}
    if os.path.exists(index_path):
        with open(index_path) as handle:
            index = json.load(handle)
    in_place = sum("safetensors_file" in entry for entry in index.values())
    copied = [f for f in os.listdir(offload) if f.endswith(".dat")] if os.path.isdir(offload) else []
    where = f"{in_place} weights read in place from the safetensors shards, {len(copied)} copied to {offload}"
    print(f"loaded in {time.perf_counter() - start:.2f} s; {len(on_disk)} modules on disk ({where})")

    prompt = torch.randint(0, args.vocab, (2, 6), generator=torch.Generator().manual_seed(1))
    start = time.perf_counter()
    offloaded_out = generate(model, prompt, args.new_tokens)
    offloaded_s = time.perf_counter() - start
    start = time.perf_counter()
    reference_out = generate(reference, prompt, args.new_tokens)
    reference_s = time.perf_counter() - start
    if not torch.equal(offloaded_out, reference_out):
        raise SystemExit("the offloaded model generated different tokens from the in-memory model")
    with torch.no_grad():
        difference = (model(prompt) - reference(prompt)).abs().max().item()
    print(f"generated {args.new_tokens} tokens: {offloaded_out[0, -args.new_tokens :].tolist()}")
    print(
        f"same tokens as the in-memory model (max logit difference {difference:.1e}); "
        f"{offloaded_s:.2f} s with offload vs {reference_s:.2f} s in memory"
    )


if __name__ == "__main__":
    main()
