"""How long a checkpoint blocks training: synchronous ``save_state``, asynchronous ``save_state`` and torch's
``dcp.async_save`` driven by hand, for a ~200 MB model with AdamW on 2 CPU processes, under DDP and under
FSDP2 (sharded state dicts).

    python tools/bench/async_save.py [--quick] [--backend ddp|fsdp2|both]

"Blocked" is the time the training loop spends inside the call (the slower of the two processes): the
whole write for the synchronous save, the copy into CPU memory (staging) for the asynchronous ones.
"Total" runs until the checkpoint is complete (``wait_for_checkpoint()`` / the future's ``result()``)
with two training steps in between, against the synchronous save followed by the same two steps.
torch's ``dcp.async_save`` gets the same state dicts (``get_state_dict`` under FSDP2) and a gloo group of
its own, as accel's background writes do.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WIDTH, DEPTH = 2048, 12  # 12 x 4.2 M parameters: 201 MB of fp32 weights, 604 MB with AdamW's two moments


def _step(accelerator, model, optimizer) -> None:
    import torch

    accelerator.backward(model(torch.randn(4, WIDTH)).pow(2).mean())
    optimizer.step()
    optimizer.zero_grad()


def _accelerator(backend: str):
    from accel_train import Accelerator, FullyShardedDataParallelPlugin

    if backend == "fsdp2":
        plugin = FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type="SHARDED_STATE_DICT")
        return Accelerator(cpu=True, fsdp_plugin=plugin)
    return Accelerator(cpu=True)


def _by_hand_state(accelerator, model, optimizer, backend: str) -> dict:
    """The state dicts torch's ``dcp.async_save`` is given: plain ones under DDP, the sharded ones under FSDP2."""
    if backend == "fsdp2":
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optimizer_state = get_state_dict(model, optimizer.optimizer)
        return {"model": model_state, "optimizer": optimizer_state}
    return {"model": accelerator.unwrap_model(model).state_dict(), "optimizer": optimizer.state_dict()}


def worker(backend: str, repeats: int, folder: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    torch.set_num_threads(1)
    accelerator = _accelerator(backend)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(DEPTH)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    model, optimizer = accelerator.prepare(model, optimizer)
    _step(accelerator, model, optimizer)
    size = 4 * WIDTH * (WIDTH + 1) * DEPTH  # fp32 weights and biases (the whole model, not a shard)
    side_group = dist.new_group(backend="gloo")  # dcp's own collectives stay off the training group
    rank = accelerator.process_index
    times: dict[str, list[float]] = {key: [] for key in ("steps", "sync", "async", "async_total", "dcp", "dcp_total")}
    for index in range(repeats):
        start = time.perf_counter()
        for _ in range(2):
            _step(accelerator, model, optimizer)
        times["steps"].append(time.perf_counter() - start)

        target = os.path.join(folder, f"sync_{index}")
        start = time.perf_counter()
        accelerator.save_state(target)
        times["sync"].append(time.perf_counter() - start)

        target = os.path.join(folder, f"async_{index}")
        start = time.perf_counter()
        accelerator.save_state(target, async_save=True)
        times["async"].append(time.perf_counter() - start)
        for _ in range(2):
            _step(accelerator, model, optimizer)
        accelerator.wait_for_checkpoint()
        times["async_total"].append(time.perf_counter() - start)
        accelerator.wait_for_everyone()

        target = os.path.join(folder, f"dcp_{index}")
        start = time.perf_counter()
        state = _by_hand_state(accelerator, model, optimizer, backend)
        future = dcp.async_save(state, checkpoint_id=target, process_group=side_group)
        times["dcp"].append(time.perf_counter() - start)
        for _ in range(2):
            _step(accelerator, model, optimizer)
        future.result()
        times["dcp_total"].append(time.perf_counter() - start)
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            for name in os.listdir(folder):
                shutil.rmtree(os.path.join(folder, name), ignore_errors=True)
        accelerator.wait_for_everyone()
    medians = {key: statistics.median(values) for key, values in times.items()}
    gathered: list = [None, None]
    dist.all_gather_object(gathered, medians)
    if rank == 0:
        slowest = {key: max(row[key] for row in gathered) for key in medians}
        print(json.dumps({"model_mb": size / 2**20, "repeats": repeats, **slowest}))
    accelerator.end_training()


def _measure(backend: str, repeats: int) -> dict:
    """Run the worker on 2 processes (torch.distributed.run) and return its medians."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    folder = tempfile.mkdtemp(prefix="async_save_bench_")
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port)]
    command += [__file__, "--worker", backend, str(repeats), folder]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "true"}
    try:
        result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800, check=False)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
    return json.loads([line for line in result.stdout.splitlines() if line.startswith("{")][-1])


def _report(backend: str, data: dict) -> None:
    from _common import ratio_line

    name = {"ddp": "DDP", "fsdp2": "FSDP2 (sharded)"}[backend]
    print(
        f"save_state, {name}, {data['model_mb']:.0f} MiB model + AdamW, 2 processes (gloo, CPU), "
        f"median of {data['repeats']}, slower process"
    )
    print(f"{'blocked: synchronous save_state':<58} {data['sync']:10.4f} s")
    print(ratio_line(f"{backend} blocked: async save_state / synchronous", data["async"], data["sync"], goal="<= 0.10"))
    print(ratio_line(f"{backend} blocked: dcp.async_save by hand / synchronous", data["dcp"], data["sync"]))
    print(ratio_line(f"{backend} blocked: async save_state / dcp.async_save", data["async"], data["dcp"]))
    print(f"{'two training steps alone':<58} {data['steps']:10.4f} s")
    steps_and_sync = data["steps"] + data["sync"]
    print(ratio_line(f"{backend} total: async + 2 steps / sync + 2 steps", data["async_total"], steps_and_sync))
    print(ratio_line(f"{backend} total: dcp.async_save + 2 steps / sync + 2 steps", data["dcp_total"], steps_and_sync))


def main() -> None:
    sys.path.insert(0, HERE)
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--backend", choices=("ddp", "fsdp2", "both"), default="both")
    parser.add_argument("--worker", nargs=3, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker[0], int(args.worker[1]), args.worker[2])
        return
    repeats = 2 if args.quick else 5
    for backend in ("ddp", "fsdp2") if args.backend == "both" else (args.backend,):
        _report(backend, _measure(backend, repeats))


if __name__ == "__main__":
    main()
