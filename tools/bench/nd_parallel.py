"""Training steps per second on a dp_shard=2 x tp=2 mesh (4 CPU processes, gloo): a loop prepared by
the Accelerator against the same mesh, tensor-parallel plan and FSDP2 sharding applied by hand.

    .venv/bin/python tools/bench/nd_parallel.py [--steps 20] [--repeats 3]

Each worker alternates the hand-built loop and the prepared loop ``--repeats`` times and keeps the
best time of each, so both see the same machine. Goal: prepared / by hand >= 0.97. The reference
release has no CPU path for this (its FSDP refuses a machine without an accelerator), so no
reference column is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

WIDTH, HIDDEN, DEPTH, BATCH = 256, 1024, 4, 16
PLAN = {"blocks.*.up": "colwise", "blocks.*.down": "rowwise"}


def _model():
    import torch

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up = torch.nn.Linear(WIDTH, HIDDEN)
            self.down = torch.nn.Linear(HIDDEN, WIDTH)

        def forward(self, x):
            return x + self.down(torch.relu(self.up(x)))

    class Net(torch.nn.Module):
        tp_plan = PLAN

        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList(Block() for _ in range(DEPTH))

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return x

    torch.manual_seed(0)
    return Net()


def _data(steps: int, dp: int):
    import torch

    generator = torch.Generator().manual_seed(0)
    n = BATCH * steps * dp
    return torch.utils.data.TensorDataset(
        torch.randn(n, WIDTH, generator=generator), torch.randn(n, WIDTH, generator=generator)
    )


def _by_hand(steps: int) -> float:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_shard", "tp"))
    model = _model()
    plan = {}
    for index in range(DEPTH):
        plan[f"blocks.{index}.up"] = ColwiseParallel()
        plan[f"blocks.{index}.down"] = RowwiseParallel()
    parallelize_module(model, mesh["tp"], plan)
    for block in model.blocks:
        fully_shard(block, mesh=mesh["dp_shard"])
    fully_shard(model, mesh=mesh["dp_shard"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    dataset = _data(steps, 2)
    sampler = torch.utils.data.distributed.DistributedSampler(
        dataset, num_replicas=2, rank=mesh["dp_shard"].get_local_rank(), shuffle=False
    )
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=sampler)
    dist.barrier()
    start = time.perf_counter()
    for x, y in loader:
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    dist.barrier()
    return time.perf_counter() - start


def _prepared(steps: int) -> float:
    import torch
    import torch.distributed as dist

    from accel_state.state import AcceleratorState, GradientState
    from accel_train import Accelerator, ParallelismConfig

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    accelerator = Accelerator(cpu=True, parallelism_config=ParallelismConfig(dp_shard_size=2, tp_size=2))
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loader = torch.utils.data.DataLoader(_data(steps, 2), batch_size=BATCH)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    dist.barrier()
    start = time.perf_counter()
    for x, y in loader:
        accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
        optimizer.zero_grad()
    dist.barrier()
    return time.perf_counter() - start


def worker(steps: int, repeats: int) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    hand, prepared = [], []
    for _ in range(repeats):
        hand.append(_by_hand(steps))
        prepared.append(_prepared(steps))
    if dist.get_rank() == 0:
        print(json.dumps({"hand": min(hand), "prepared": min(prepared)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.steps, args.repeats)
        return
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "4", __file__, "--worker"]
    command += ["--steps", str(args.steps), "--repeats", str(args.repeats)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "true"}
    result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if result.returncode != 0:
        raise SystemExit(result.stderr[-4000:])
    times = json.loads([line for line in result.stdout.splitlines() if line.startswith("{")][-1])
    steps_hand, steps_prepared = args.steps / times["hand"], args.steps / times["prepared"]
    print("dp_shard=2 x tp=2, 4 CPU processes (gloo), 4 blocks 256->1024->256, batch 16 per data-parallel rank")
    print(f"by hand (parallelize_module + fully_shard): {steps_hand:8.2f} steps/s")
    print(f"prepared by the Accelerator:                {steps_prepared:8.2f} steps/s")
    print(f"ratio prepared / by hand: {steps_prepared / steps_hand:.3f}   goal >= 0.97")


if __name__ == "__main__":
    main()
