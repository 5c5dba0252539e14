"""Throughput of a prepared data loader against the raw ``DataLoader``, and against the reference ``accelerate``.

    .venv/bin/python tools/bench/dataloader.py [--samples 4096] [--batch-size 64] [--rounds 7]

Map-style dataset of CPU tensors, batch 64, shuffled; the prepared loader places batches on the CPU
device (what ``Accelerator.prepare`` does on a CPU machine). Measured in one process, then per process
with two gloo processes (each reads its shard). Every figure is batches per second; the ratio is
prepared / raw, measured in the same process, epoch by epoch (raw, prepared, raw), median over ``--rounds``. Goal: >= 0.98.
Each library runs in its own interpreter: accel in this one, the reference in ``.venv-reference``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import ROOT, reference_python


def free_port_hint() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _worker(library: str, samples: int, batch_size: int, rounds: int, epochs: int) -> dict[str, float]:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.set_num_threads(1)
    if library == "accel":
        from accel_data.data_loader import prepare_data_loader
        from accel_state.state import PartialState
    else:
        from accelerate.data_loader import prepare_data_loader  # type: ignore[no-redef]
        from accelerate.state import PartialState  # type: ignore[no-redef]

    if library == "accel":
        state = PartialState(cpu=True)
    else:
        from accelerate import Accelerator

        Accelerator(cpu=True)  # the reference's RNG synchronisation needs the full state
        state = PartialState()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(samples, 32), torch.randint(0, 10, (samples,)))

    def raw_loader() -> DataLoader:
        return DataLoader(data, batch_size=batch_size, shuffle=True)

    prepared = prepare_data_loader(
        raw_loader(), device=torch.device("cpu"), put_on_device=True, rng_types=["generator"]
    )
    raw = raw_loader()
    # The raw loader of a process in a group reads what its shard holds: the same number of batches.
    raw_batches = len(prepared)

    def seconds(loader: Any, limit: int | None) -> float:
        start = time.perf_counter()
        if limit is None:
            for _batch in loader:
                pass
        else:
            for count, _batch in enumerate(loader, 1):
                if count == limit:
                    break
        return time.perf_counter() - start

    for _ in range(epochs):  # warm up
        seconds(raw, raw_batches), seconds(prepared, None)
    raw_times, prepared_times, ratios = [], [], []
    for _ in range(rounds):
        # raw, prepared, raw: the ratio compares each prepared epoch with the raw ones around it
        before = seconds(raw, raw_batches)
        mine = seconds(prepared, None)
        after = seconds(raw, raw_batches)
        raw_times += [before, after]
        prepared_times.append(mine)
        ratios.append((before + after) / 2 / mine)
    state.wait_for_everyone()
    return {
        "raw": raw_batches / statistics.median(raw_times),
        "prepared": raw_batches / statistics.median(prepared_times),
        "ratio": statistics.median(ratios),
        "rank": state.process_index,
    }


def _launch(python: str, library: str, processes: int, args: argparse.Namespace) -> list[dict[str, float]]:
    """Run the worker in ``processes`` fresh interpreters joined by gloo; one result per process."""
    port = free_port_hint()
    base = [
        python,
        os.path.abspath(__file__),
        "--worker",
        library,
        "--samples",
        str(args.samples),
        "--batch-size",
        str(args.batch_size),
        "--rounds",
        str(args.rounds),
        "--epochs",
        str(args.epochs),
    ]
    procs = []
    for rank in range(processes):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "true"}
        if processes > 1:
            env.update(
                {
                    "RANK": str(rank),
                    "WORLD_SIZE": str(processes),
                    "LOCAL_RANK": str(rank),
                    "LOCAL_WORLD_SIZE": str(processes),
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port),
                }
            )
        procs.append(
            subprocess.Popen(base, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        )
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=1800)
        if proc.returncode != 0:
            raise RuntimeError(f"{library} worker failed:\n{err[-4000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--epochs", type=int, default=40, help="warm-up epochs")
    parser.add_argument("--worker", choices=["accel", "reference"])
    parser.add_argument("--processes", type=int, nargs="*", default=[1, 2])
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(_worker(args.worker, args.samples, args.batch_size, args.rounds, args.epochs)))
        return 0

    reference = reference_python()
    print(f"prepared DataLoader vs raw DataLoader: {args.samples} samples, batch {args.batch_size}, shuffled, CPU")
    print(f"{'':<44}{'raw b/s':>12}{'prepared b/s':>14}{'ratio':>8}   goal >= 0.98")
    for processes in args.processes:
        runs = [("accel", sys.executable)] + ([("accelerate (reference)", reference)] if reference else [])
        for label, python in runs:
            library = "accel" if label == "accel" else "reference"
            for result in _launch(python, library, processes, args):
                name = f"{label}, {processes} process{'es' if processes > 1 else ''}, rank {int(result['rank'])}"
                print(f"{name:<44}{result['raw']:12.1f}{result['prepared']:14.1f}{result['ratio']:8.3f}")
    if not reference:
        print("(no reference interpreter: build .venv-reference or set ACCEL_REFERENCE_PYTHON)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
