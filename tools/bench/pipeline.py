"""Training steps per second of a 2-stage pipeline (2 CPU processes, gloo, 1F1B, 4 micro-batches): a
loop prepared by the Accelerator (``ParallelismConfig(pp_size=2)``) against the same schedule driven
by hand with torch's pipelining API (``PipelineStage`` + ``Schedule1F1B``).

    .venv/bin/python tools/bench/pipeline.py [--steps 20] [--repeats 3] [--schedule 1f1b|gpipe]

Each worker alternates the hand-built loop and the prepared loop ``--repeats`` times and keeps the
best time of each, so both see the same machine. Goal: prepared / by hand >= 0.97. The reference
release has no pipeline-parallel training, so no reference column is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

WIDTH, HIDDEN, DEPTH, BATCH, MICRO = 256, 1024, 4, 32, 4


def _model():
    import torch

    torch.manual_seed(0)
    layers = []
    for _ in range(DEPTH):
        layers += [torch.nn.Linear(WIDTH, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, WIDTH)]
    return torch.nn.Sequential(*layers)


def _data(steps: int):
    import torch

    generator = torch.Generator().manual_seed(0)
    n = BATCH * steps
    return torch.utils.data.TensorDataset(
        torch.randn(n, WIDTH, generator=generator), torch.randn(n, WIDTH, generator=generator)
    )


def _mse(out, target):
    import torch

    return torch.nn.functional.mse_loss(out, target)


def _by_hand(steps: int, schedule: str) -> float:
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    rank = dist.get_rank()
    model = _model()
    half = len(model) // 2
    stage_module = model[:half] if rank == 0 else model[half:]
    stage = PipelineStage(stage_module, rank, 2, torch.device("cpu"))
    cls = ScheduleGPipe if schedule == "gpipe" else Schedule1F1B
    pipe = cls(stage, n_microbatches=MICRO, loss_fn=_mse)
    optimizer = torch.optim.AdamW(stage_module.parameters(), lr=1e-4)
    loader = torch.utils.data.DataLoader(_data(steps), batch_size=BATCH)
    dist.barrier()
    start = time.perf_counter()
    for x, y in loader:
        if rank == 0:
            pipe.step(x)
        else:
            pipe.step(target=y, losses=[])
        optimizer.step()
        optimizer.zero_grad()
    dist.barrier()
    return time.perf_counter() - start


def _prepared(steps: int, schedule: str) -> float:
    import torch
    import torch.distributed as dist

    from accel_state.state import AcceleratorState, GradientState
    from accel_train import Accelerator, ParallelismConfig
    from accel_train.strategies.pipeline import PipelineParallelConfig

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    handler = PipelineParallelConfig(
        schedule=schedule, num_microbatches=MICRO, loss_fn=_mse, split_points=[DEPTH * 3 // 2]
    )
    accelerator = Accelerator(cpu=True, parallelism_config=ParallelismConfig(pp_size=2, pp_handler=handler))
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loader = torch.utils.data.DataLoader(_data(steps), batch_size=BATCH)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    dist.barrier()
    start = time.perf_counter()
    for x, y in loader:
        accelerator.backward(model(x, target=y))
        optimizer.step()
        optimizer.zero_grad()
    dist.barrier()
    return time.perf_counter() - start


def worker(steps: int, repeats: int, schedule: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    hand, prepared = [], []
    for _ in range(repeats):
        hand.append(_by_hand(steps, schedule))
        prepared.append(_prepared(steps, schedule))
    if dist.get_rank() == 0:
        print(json.dumps({"hand": min(hand), "prepared": min(prepared)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--schedule", choices=("1f1b", "gpipe"), default="1f1b")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.steps, args.repeats, args.schedule)
        return
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", __file__, "--worker"]
    command += ["--steps", str(args.steps), "--repeats", str(args.repeats), "--schedule", args.schedule]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "true"}
    result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if result.returncode != 0:
        raise SystemExit(result.stderr[-4000:])
    times = json.loads([line for line in result.stdout.splitlines() if line.startswith("{")][-1])
    steps_hand, steps_prepared = args.steps / times["hand"], args.steps / times["prepared"]
    print(
        f"pp=2, 2 CPU processes (gloo), {args.schedule}, {MICRO} micro-batches, "
        f"{DEPTH} blocks {WIDTH}->{HIDDEN}->{WIDTH}, batch {BATCH}"
    )
    print(f"by hand (PipelineStage + schedule.step): {steps_hand:8.2f} steps/s")
    print(f"prepared by the Accelerator:             {steps_prepared:8.2f} steps/s")
    print(f"ratio prepared / by hand: {steps_prepared / steps_hand:.3f}   goal >= 0.97")


if __name__ == "__main__":
    main()
