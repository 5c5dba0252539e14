"""Training steps per second of an FSDP2 loop prepared by the Accelerator against the same model
sharded by hand with ``fully_shard`` (same units, same policy), on two processes (gloo, CPU).

    .venv/bin/python tools/bench/fsdp_step_rate.py            # 2 processes
    .venv/bin/python tools/bench/fsdp_step_rate.py --quick    # fewer repeats

Each worker alternates the hand-sharded loop and the prepared loop several times and keeps the best
time of each (so both see the same machine). Goal: prepared / by hand >= 0.97. The reference
``accelerate`` release refuses FSDP on a machine without an accelerator, so on CPU it is not
measured (said in the output).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WIDTH, DEPTH, BATCH, STEPS = 256, 4, 32, 30


def _model():
    """The benchmark model and its block class (the unit each side wraps)."""
    from _block_net import block_net

    model = block_net(WIDTH, DEPTH)
    return model, type(model.blocks[0])


def _batches():
    import torch

    generator = torch.Generator().manual_seed(0)
    return [(torch.randn(BATCH, WIDTH, generator=generator), torch.randn(BATCH, 1, generator=generator))] * STEPS


def _loop(model, optimizer, backward, batches) -> float:
    import torch
    import torch.distributed as dist

    dist.barrier()
    start = time.perf_counter()
    for x, y in batches:
        loss = torch.nn.functional.mse_loss(model(x), y)
        backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    dist.barrier()
    return time.perf_counter() - start


def _by_hand(batches) -> float:
    import torch
    from torch.distributed.fsdp import fully_shard

    model, block_cls = _model()
    for module in model.modules():
        if isinstance(module, block_cls):
            fully_shard(module, reshard_after_forward=True)
    fully_shard(model, reshard_after_forward=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return _loop(model, optimizer, lambda loss: loss.backward(), batches)


def _prepared(batches) -> float:
    import torch

    from accel_state.state import AcceleratorState, GradientState
    from accel_train import Accelerator, FullyShardedDataParallelPlugin

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2,
        auto_wrap_policy="TRANSFORMER_BASED_WRAP",
        transformer_cls_names_to_wrap=["Block"],
        reshard_after_forward=True,
        cpu_ram_efficient_loading=False,
        sync_module_states=False,
    )
    accelerator = Accelerator(cpu=True, fsdp_plugin=plugin)
    model, _ = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer = accelerator.prepare(model, optimizer)
    return _loop(model, optimizer, accelerator.backward, batches)


def worker(repeats: int) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    batches = _batches()
    _by_hand(batches[:5])
    _prepared(batches[:5])
    hand, prepared = [], []
    for index in range(repeats):
        if index % 2 == 0:
            hand.append(_by_hand(batches))
            prepared.append(_prepared(batches))
        else:
            prepared.append(_prepared(batches))
            hand.append(_by_hand(batches))
    if dist.get_rank() == 0:
        import statistics

        print(
            json.dumps(
                {
                    "hand": STEPS / min(hand),
                    "prepared": STEPS / min(prepared),
                    "median_ratio": statistics.median(h / p for h, p in zip(hand, prepared)),
                }
            )
        )
    dist.destroy_process_group()


def main() -> None:
    sys.path.insert(0, HERE)
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker)
        return
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    repeats = 3 if args.quick else 7
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(port),
        __file__,
        "--worker",
        str(repeats),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "true"}
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800, check=False)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
    data = json.loads([line for line in result.stdout.splitlines() if line.startswith("{")][-1])
    from _common import ratio_line

    print(f"FSDP2 training loop, {DEPTH} blocks of width {WIDTH}, batch {BATCH} per rank, 2 processes (gloo, CPU)")
    print(
        ratio_line(
            "steps/s: prepared FSDP2 / fully_shard by hand (best)",
            data["prepared"],
            data["hand"],
            unit="st/s",
            goal=">= 0.97",
        )
    )
    print(f"{'median over pairs of runs (by hand time / prepared time)':<58} {data['median_ratio']:6.3f}")
    print("reference accelerate: not measured (it refuses FSDP on a machine without an accelerator)")


if __name__ == "__main__":
    main()
