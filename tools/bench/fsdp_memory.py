"""Memory per rank held by parameters + gradients + AdamW state: FSDP (FULL_SHARD) on two ranks
against DDP, both prepared by the Accelerator (gloo, CPU; CUDA when there are two GPUs).

    .venv/bin/python tools/bench/fsdp_memory.py

After a training step (before ``zero_grad``), each rank counts the bytes of the distinct storages
behind its parameters (local shards for FSDP), their gradients and the optimizer's state tensors:
that is what the strategy keeps between steps. With CUDA the allocator's peak
(``max_memory_allocated``) is printed too. Goal: FSDP / DDP <= 0.55 for FSDP1 FULL_SHARD and for
FSDP2 (reshard after forward).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
WIDTH, DEPTH, BATCH = 512, 4, 16


def _model():
    from _block_net import block_net

    return block_net(WIDTH, DEPTH)


def _local(tensor):
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _held_bytes(model, optimizer) -> dict:
    """Bytes of the distinct storages behind parameters, gradients and optimizer state."""
    import torch

    seen: set = set()

    def size(tensors) -> int:
        total = 0
        for tensor in tensors:
            if not isinstance(tensor, torch.Tensor):
                continue
            tensor = _local(tensor)
            storage = tensor.untyped_storage()
            key = (storage.data_ptr(), storage.nbytes())
            if storage.nbytes() == 0 or key in seen:
                continue
            seen.add(key)
            total += storage.nbytes()
        return total

    params = list(model.parameters())
    # FSDP1's flat parameters hold the shards behind the original parameters' views.
    flat = [m._flat_param for m in model.modules() if getattr(m, "_flat_param", None) is not None]
    out = {"params": size(flat + params)}
    out["grads"] = size([p.grad for p in flat + params if p.grad is not None])
    out["optimizer"] = size([v for state in optimizer.state.values() for v in state.values()])
    out["total"] = out["params"] + out["grads"] + out["optimizer"]
    return out


def _run(kind: str) -> dict:
    import torch

    from accel_state.state import AcceleratorState, GradientState
    from accel_train import Accelerator, FullyShardedDataParallelPlugin

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    plugin = None
    if kind == "fsdp1":
        plugin = FullyShardedDataParallelPlugin(
            fsdp_version=1, sharding_strategy="FULL_SHARD", auto_wrap_policy="TRANSFORMER_BASED_WRAP",
            transformer_cls_names_to_wrap=["Block"], cpu_ram_efficient_loading=False,
        )  # fmt: skip
    elif kind == "fsdp2":
        plugin = FullyShardedDataParallelPlugin(
            fsdp_version=2, auto_wrap_policy="TRANSFORMER_BASED_WRAP", transformer_cls_names_to_wrap=["Block"],
            cpu_ram_efficient_loading=False,
        )  # fmt: skip
    accelerator = Accelerator(fsdp_plugin=plugin)
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer = accelerator.prepare(model, optimizer)
    cuda = accelerator.device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    x = torch.randn(BATCH, WIDTH, device=accelerator.device)
    for _ in range(2):
        accelerator.backward(model(x).pow(2).mean())
        optimizer.step()
    held = _held_bytes(model, optimizer.optimizer)
    if cuda:
        held["cuda_peak"] = torch.cuda.max_memory_allocated()
    optimizer.zero_grad()
    return held


def worker() -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    results = {kind: _run(kind) for kind in ("ddp", "fsdp1", "fsdp2")}
    if dist.get_rank() == 0:
        print(json.dumps(results))
    dist.destroy_process_group()


def main() -> None:
    sys.path.insert(0, HERE)
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker()
        return
    import socket

    import torch

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port)]
    command += [__file__, "--worker"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if not (torch.cuda.is_available() and torch.cuda.device_count() >= 2):
        env["ACCELERATE_USE_CPU"] = "true"
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800, check=False)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
    data = json.loads([line for line in result.stdout.splitlines() if line.startswith("{")][-1])
    from _common import ratio_line

    mib = 1024 * 1024
    ddp = data["ddp"]
    print(f"parameters + gradients + AdamW state per rank, {DEPTH} blocks of width {WIDTH}, 2 processes")
    for part in ("params", "grads", "optimizer"):
        print(f"  DDP {part:<10} {ddp[part] / mib:8.2f} MiB")
    for kind, label in (("fsdp1", "FSDP1 FULL_SHARD"), ("fsdp2", "FSDP2 reshard_after_forward")):
        print(ratio_line(f"held bytes: {label} / DDP", data[kind]["total"] / mib, ddp["total"] / mib, "MiB", "<= 0.55"))
        if "cuda_peak" in data[kind]:
            print(ratio_line(f"CUDA peak: {label} / DDP", data[kind]["cuda_peak"] / mib, ddp["cuda_peak"] / mib, "MiB"))
    print("reference accelerate: not measured (it refuses FSDP on a machine without an accelerator)")


if __name__ == "__main__":
    main()
