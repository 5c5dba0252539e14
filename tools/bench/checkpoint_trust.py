"""What the checkpoint checks cost, and what resharding costs (gloo, CPU).

    .venv/bin/python tools/bench/checkpoint_trust.py [--width 1024] [--repeat 3]

1. ``load_state`` of a 2-process FSDP2 sharded checkpoint (about 200 MB: weights and AdamW state), with
   accel's checks (every DCP item checked before loading, allow-list metadata reader) over the same
   files loaded by hand with ``get_*_state_dict`` + ``dcp.load`` + ``set_*_state_dict``. Goal <= 1.05.
2. Resharding: ``load_state`` on 4 processes of a checkpoint written by 2, over the same load of a
   checkpoint written by 4. Goal <= 1.5.

Each ratio is given in wall time (median of ``--repeat``) and in CPU time summed over the processes (the
median too; steadier than wall time on a loaded machine).

The reference ``accelerate`` is not measured: it does not check these files (its load runs the pickles).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _prepared(width: int):
    import torch
    from _block_net import block_net

    from accel_state.state import AcceleratorState, GradientState
    from accel_train import Accelerator, FullyShardedDataParallelPlugin

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2, state_dict_type="SHARDED_STATE_DICT", auto_wrap_policy="TRANSFORMER_BASED_WRAP",
        transformer_cls_names_to_wrap=["Block"], cpu_ram_efficient_loading=False,
    )  # fmt: skip
    accelerator = Accelerator(fsdp_plugin=plugin)
    model = block_net(width, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.backward(model(torch.randn(4, width)).pow(2).mean())
    optimizer.step()
    optimizer.zero_grad()
    return accelerator, model, optimizer


def _by_hand(model, optimizer, folder: str) -> None:
    """What a user would write with torch alone: the same two DCP folders, no checks."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    state = {"model": get_model_state_dict(model)}
    dcp.load(state, storage_reader=dcp.FileSystemReader(os.path.join(folder, "pytorch_model_fsdp_0")))
    set_model_state_dict(model, state["model"])
    optim = {"optimizer": get_optimizer_state_dict(model, optimizer)}
    dcp.load(
        optim,
        storage_reader=dcp.FileSystemReader(os.path.join(folder, "optimizer_0")),
        planner=DefaultLoadPlanner(flatten_sharded_tensors=False),
    )
    set_optimizer_state_dict(model, optimizer, optim["optimizer"])


def worker(mode: str, folder: str, width: int, repeat: int) -> None:
    import torch.distributed as dist

    accelerator, model, optimizer = _prepared(width)
    out: dict = {}
    if mode == "save":
        accelerator.save_state(folder)
    else:
        import torch

        timings: dict[str, list[float]] = {"accel": [], "by_hand": [], "accel_cpu": [], "by_hand_cpu": []}
        for _ in range(repeat):
            for label in ("by_hand", "accel"):  # alternate, so both see the same page cache
                gc.collect()  # neither pays for the other's garbage
                dist.barrier()
                start, cpu = time.perf_counter(), time.process_time()
                if label == "accel":
                    accelerator.load_state(folder)
                else:
                    _by_hand(model, optimizer.optimizer, folder)
                cpu = time.process_time() - cpu  # this process's CPU time, before waiting for the others
                dist.barrier()
                timings[label].append(time.perf_counter() - start)
                total = torch.tensor([cpu], dtype=torch.float64)
                dist.all_reduce(total)  # CPU time of all processes together
                timings[f"{label}_cpu"].append(float(total))
        out = {k: sorted(v)[len(v) // 2] for k, v in timings.items()}
    if dist.get_rank() == 0:
        print(json.dumps(out))
    dist.destroy_process_group()


def _launch(nproc: int, *args: str) -> dict:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc)]
    command += ["--master_port", str(port), __file__, "--worker", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "true"}
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=3600, check=False)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


def _size(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(folder) for f in files)


def main() -> None:
    sys.path.insert(0, HERE)
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", nargs=2, metavar=("MODE", "FOLDER"), help=argparse.SUPPRESS)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker[0], args.worker[1], args.width, args.repeat)
        return
    from _common import ratio_line

    common = ["--width", str(args.width), "--repeat", str(args.repeat)]
    with tempfile.TemporaryDirectory() as tmp:
        two, four = os.path.join(tmp, "two"), os.path.join(tmp, "four")
        _launch(2, "save", two, *common)
        print(f"checkpoint written by 2 processes: {_size(two) / 1e6:.0f} MB")
        same = _launch(2, "load", two, *common)
        print(
            ratio_line(
                "load_state with checks / dcp.load by hand (2 -> 2)", same["accel"], same["by_hand"], "s", "<= 1.05"
            )
        )
        print(ratio_line("  the same in CPU time (both processes)", same["accel_cpu"], same["by_hand_cpu"], "s"))
        _launch(4, "save", four, *common)
        reshard = _launch(4, "load", two, *common)
        plain = _launch(4, "load", four, *common)
        print(ratio_line("load_state 2 -> 4 / 4 -> 4", reshard["accel"], plain["accel"], "s", "<= 1.5"))
        print(ratio_line("  the same in CPU time (all processes)", reshard["accel_cpu"], plain["accel_cpu"], "s"))


if __name__ == "__main__":
    main()
