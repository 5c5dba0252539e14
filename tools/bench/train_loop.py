"""Training steps per second: a loop prepared by the Accelerator against the same loop in plain PyTorch.

    .venv/bin/python tools/bench/train_loop.py            # every case, accel and the reference
    .venv/bin/python tools/bench/train_loop.py --quick    # fewer repeats

Cases: a 4x1024 MLP and a tiny 4x64 MLP, with and without gradient accumulation (4 steps), in one
process and in two processes (DDP over gloo, CPU; started with ``torch.distributed.run``). Each worker
process alternates the plain loop and the prepared loop several times and keeps the best time of
each, so both see the same machine; the reference ``accelerate`` runs the same worker in its own
venv. Goals: prepared/plain >= 0.98 for the 4x1024 MLP and >= 0.95 for the tiny one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES = {"mlp4x1024": 1024, "mlp4x64": 64}
STEPS = {"mlp4x1024": 30, "mlp4x64": 400}
BATCH = 32


# -- worker (runs under accel's venv or the reference's) -------------------------------------------


def _model(width: int):
    import torch

    torch.manual_seed(0)
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def _data(width: int, steps: int, world: int):
    import torch

    generator = torch.Generator().manual_seed(0)
    n = BATCH * steps * world
    return torch.utils.data.TensorDataset(
        torch.randn(n, width, generator=generator), torch.randn(n, width, generator=generator)
    )


def _plain_loop(width: int, steps: int, accumulation: int) -> float:
    import torch
    import torch.distributed as dist

    world = dist.get_world_size() if dist.is_initialized() else 1
    model = _model(width)
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    dataset = _data(width, steps, world)
    sampler = torch.utils.data.distributed.DistributedSampler(dataset, shuffle=False) if world > 1 else None
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=sampler)
    if world > 1:
        dist.barrier()
    start = time.perf_counter()
    for index, (x, y) in enumerate(loader):
        sync = (index + 1) % accumulation == 0 or index + 1 == len(loader)
        context = model.no_sync() if world > 1 and not sync else _null()
        with context:
            loss = torch.nn.functional.mse_loss(model(x), y)
            (loss / accumulation if accumulation > 1 else loss).backward()
        if sync:
            optimizer.step()
            optimizer.zero_grad()
    if world > 1:
        dist.barrier()
    return time.perf_counter() - start


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _prepared_loop(framework: str, width: int, steps: int, accumulation: int) -> float:
    import torch
    import torch.distributed as dist

    if framework == "accel":
        from accel_state.state import AcceleratorState, GradientState
        from accel_train import Accelerator
    else:
        from accelerate import Accelerator
        from accelerate.state import AcceleratorState, GradientState
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=accumulation)
    world = accelerator.num_processes
    model = _model(width)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loader = torch.utils.data.DataLoader(_data(width, steps, world), batch_size=BATCH)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    if world > 1:
        dist.barrier()
    start = time.perf_counter()
    if accumulation > 1:
        for x, y in loader:
            with accelerator.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
    else:
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    if world > 1:
        dist.barrier()
    return time.perf_counter() - start


def worker(framework: str, model_name: str, accumulation: int, repeats: int) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        dist.init_process_group("gloo")
    width, steps = SIZES[model_name], STEPS[model_name]
    _plain_loop(width, steps // 4, accumulation)  # warm-up of both
    _prepared_loop(framework, width, steps // 4, accumulation)
    plain, prepared = [], []
    for index in range(repeats):
        # Alternate which loop runs first, so drifts of a shared machine hit both the same way.
        if index % 2 == 0:
            plain.append(_plain_loop(width, steps, accumulation))
            prepared.append(_prepared_loop(framework, width, steps, accumulation))
        else:
            prepared.append(_prepared_loop(framework, width, steps, accumulation))
            plain.append(_plain_loop(width, steps, accumulation))
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank == 0:
        import statistics

        ratios = sorted(p / q for p, q in zip(plain, prepared))
        added = statistics.median((q - p) / steps * 1e6 for p, q in zip(plain, prepared))
        result = {
            "plain": steps / min(plain),
            "prepared": steps / min(prepared),
            "ratio": statistics.median(ratios),
            "added_us": added,
        }
        print(json.dumps(result))
    if dist.is_initialized():
        dist.destroy_process_group()


# -- driver -------------------------------------------------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run(python: str, framework: str, model_name: str, accumulation: int, processes: int, repeats: int) -> dict:
    args = [__file__, "--worker", framework, model_name, str(accumulation), str(repeats)]
    if processes > 1:
        command = [
            python,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            str(processes),
            "--master_port",
            str(_free_port()),
            *args,
        ]
    else:
        command = [python, *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": HERE}
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
    return json.loads([line for line in result.stdout.splitlines() if line.startswith("{")][-1])


def main() -> None:
    sys.path.insert(0, HERE)
    from _common import record_result, reference_python, this_python

    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-reference", action="store_true")
    parser.add_argument("--processes", type=int, choices=[1, 2], help="only the cases with this many processes")
    parser.add_argument("--repeats", type=int, help="pairs per case (default 8, 4 with --quick)")
    options = parser.parse_args()
    repeats = options.repeats or (4 if options.quick else 8)
    reference = None if options.no_reference else reference_python()
    print(
        f"training steps/s (best of {repeats}) and the median over {repeats} alternated pairs of plain time / prepared "
        f"time (batch {BATCH} per process, AdamW, CPU, 1 thread per process)"
    )
    print(
        f"{'case':<44} {'plain':>9} {'accel':>9} {'ratio':>7} {'goal':>6} {'':5} {'+us/step':>8}   {'reference':>9} {'ratio':>7} {'+us/step':>8}"
    )
    for processes in (options.processes,) if options.processes else (1, 2):
        for model_name in ("mlp4x1024", "mlp4x64"):
            for accumulation in (1, 4):
                goal = 0.98 if model_name == "mlp4x1024" else 0.95
                ours = _run(this_python(), "accel", model_name, accumulation, processes, repeats)
                ratio = ours["ratio"]
                line = (
                    f"{model_name} accum={accumulation} procs={processes} ({'DDP gloo' if processes > 1 else 'single'})".ljust(
                        44
                    )
                    + f" {ours['plain']:9.1f} {ours['prepared']:9.1f} {ratio:7.3f} {goal:6.2f}"
                    + ("  ok  " if ratio >= goal else " BELOW")
                    + f" {ours['added_us']:8.1f}"
                )
                case = f"{model_name} accum={accumulation} procs={processes}"
                # the ratio is the median of the alternated pairs (plain time / prepared time), not best / best
                record_result(
                    f"{case}: prepared / plain", ours["prepared"], ours["plain"], ratio, "steps/s", f">= {goal}"
                )
                if reference is not None:
                    ref = _run(reference, "reference", model_name, accumulation, processes, repeats)
                    line += f"   {ref['prepared']:9.1f} {ref['ratio']:7.3f} {ref['added_us']:8.1f}"
                    record_result(
                        f"reference: {case}: prepared / plain",
                        ref["prepared"],
                        ref["plain"],
                        ref["ratio"],
                        "steps/s",
                        "",
                    )
                    record_result(
                        f"{case}: accel vs reference, prepared",
                        ours["prepared"],
                        ref["prepared"],
                        ours["prepared"] / ref["prepared"],
                        "steps/s",
                        "",
                    )
                print(line, flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    else:
        main()
