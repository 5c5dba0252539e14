"""Training steps per second of a 2-stage pipeline (2 CPU processes, gloo, 1F1B, 4 micro-batches): a
loop prepared by the Accelerator (``ParallelismConfig(pp_size=2)``) against the same schedule driven
by hand with torch's pipelining API (``PipelineStage`` + ``Schedule1F1B``).

    .venv/bin/python tools/bench/pipeline.py [--steps 20] [--repeats 3] [--schedule 1f1b|gpipe]

Both loops are built once in each worker (and warmed up); then each repeat times ``--steps`` steps
of one and of the other, alternating which goes first, so both see the same machine. Printed: the
ratio of the best times and the median of the per-repeat ratios (the steadier figure on a shared machine). Goal: prepared / by hand >= 0.97. The reference
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


def _by_hand(schedule: str):
    """One step of the schedule driven with torch's pipelining API directly."""
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

    def step(x, y) -> None:
        if rank == 0:
            pipe.step(x)
        else:
            pipe.step(target=y, losses=[])
        optimizer.step()
        optimizer.zero_grad()

    return step


def _prepared(schedule: str):
    """One step of the loop prepared by the Accelerator."""
    import torch

    from accel_train import Accelerator, ParallelismConfig
    from accel_train.strategies.pipeline import PipelineParallelConfig

    handler = PipelineParallelConfig(
        schedule=schedule, num_microbatches=MICRO, loss_fn=_mse, split_points=[DEPTH * 3 // 2]
    )
    accelerator = Accelerator(cpu=True, parallelism_config=ParallelismConfig(pp_size=2, pp_handler=handler))
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer = accelerator.prepare(model, optimizer)

    def step(x, y) -> None:
        accelerator.backward(model(x, target=y))
        optimizer.step()
        optimizer.zero_grad()

    return step


def _time(step, batches) -> float:
    import torch.distributed as dist

    dist.barrier()
    start = time.perf_counter()
    for x, y in batches:
        step(x, y)
    dist.barrier()
    return time.perf_counter() - start


def worker(steps: int, repeats: int, schedule: str) -> None:
    import statistics

    import torch.distributed as dist

    dist.init_process_group("gloo")
    batches = list(_data(steps).tensors[0].split(BATCH)), list(_data(steps).tensors[1].split(BATCH))
    pairs = list(zip(*batches))
    hand, prepared = _by_hand(schedule), _prepared(schedule)
    _time(hand, pairs[:2]), _time(prepared, pairs[:2])  # warm-up: shapes inferred, buffers allocated
    hand_times, prepared_times, ratios = [], [], []
    for repeat in range(repeats):  # alternate which loop goes first, so both see the same machine
        if repeat % 2:
            p, h = _time(prepared, pairs), _time(hand, pairs)
        else:
            h, p = _time(hand, pairs), _time(prepared, pairs)
        hand_times.append(h)
        prepared_times.append(p)
        ratios.append(h / p)
    if dist.get_rank() == 0:
        print(
            json.dumps(
                {"hand": min(hand_times), "prepared": min(prepared_times), "median_ratio": statistics.median(ratios)}
            )
        )


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
    print(
        f"ratio of the best times: {steps_prepared / steps_hand:.3f}; median of the per-repeat ratios: "
        f"{times['median_ratio']:.3f}   goal >= 0.97"
    )


if __name__ == "__main__":
    main()
