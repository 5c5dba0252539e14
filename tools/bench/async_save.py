"""How long a checkpoint blocks training: synchronous ``save_state``, asynchronous ``save_state`` and torch's
``dcp.async_save`` driven by hand, for a DDP state of a ~200 MB model with AdamW on 2 CPU processes.

    python tools/bench/async_save.py [--quick]

"Blocked" is the time the training loop spends inside the call (the slower of the two processes): the
whole write for the synchronous save, the copy into CPU memory (staging) for the asynchronous ones.
"Total" runs until the checkpoint is complete (``wait_for_checkpoint()`` / the future's ``result()``)
with two training steps in between, against the synchronous save followed by the same two steps. FSDP2 is not measured: accel's asynchronous save supports one device
and DDP (sharded backends refuse ``async_save=True``).
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


def worker(repeats: int, folder: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from accel_train import Accelerator

    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(DEPTH)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    model, optimizer = accelerator.prepare(model, optimizer)
    _step(accelerator, model, optimizer)
    size = sum(p.numel() * p.element_size() for p in accelerator.unwrap_model(model).parameters())
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
        state = {"model": accelerator.unwrap_model(model).state_dict(), "optimizer": optimizer.state_dict()}
        start = time.perf_counter()
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


def main() -> None:
    sys.path.insert(0, HERE)
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--worker", nargs=2, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        worker(int(args.worker[0]), args.worker[1])
        return
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    repeats = 2 if args.quick else 5
    folder = tempfile.mkdtemp(prefix="async_save_bench_")
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
        folder,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "true"}
    try:
        result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800, check=False)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
    data = json.loads([line for line in result.stdout.splitlines() if line.startswith("{")][-1])
    from _common import ratio_line

    print(
        f"save_state of a DDP state, {data['model_mb']:.0f} MB model + AdamW, 2 processes (gloo, CPU), "
        f"median of {data['repeats']}, slower process"
    )
    print(f"{'blocked: synchronous save_state':<58} {data['sync']:10.4f} s")
    print(ratio_line("blocked: async save_state / synchronous", data["async"], data["sync"], goal="<= 0.10"))
    print(ratio_line("blocked: dcp.async_save by hand / synchronous", data["dcp"], data["sync"]))
    print(ratio_line("blocked: async save_state / dcp.async_save", data["async"], data["dcp"]))
    print(f"{'two training steps alone':<58} {data['steps']:10.4f} s")
    steps_and_sync = data["steps"] + data["sync"]
    print(ratio_line("total: async save_state + 2 steps / sync + 2 steps", data["async_total"], steps_and_sync))
    print(ratio_line("total: dcp.async_save + 2 steps / sync + 2 steps", data["dcp_total"], steps_and_sync))
    print("FSDP2: not measured (accel's asynchronous save supports one device and DDP)")


if __name__ == "__main__":
    main()
