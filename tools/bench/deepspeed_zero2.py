"""Steps per second of a ZeRO-2 loop prepared by the Accelerator against the same model given to
``deepspeed.initialize`` by hand with the same config (2 processes, gloo, CPU).

    .venv/bin/python tools/bench/deepspeed_zero2.py            # accel (and the reference, when installed)
    .venv/bin/python tools/bench/deepspeed_zero2.py --quick    # fewer repeats

Each of the two worker processes (started with ``torch.distributed.run``) alternates the by-hand
loop and the prepared loop and keeps every time; the printed ratio is the median of
by-hand time / prepared time over the repeats (prepared steps/s over by-hand steps/s). The
by-hand loop gets the config that ``prepare`` resolved, so both engines are the same. Goal: >= 0.97.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WIDTH = 512
STEPS = 40
BATCH = 16


def _model():
    import torch

    torch.manual_seed(0)
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def _dataset(world: int):
    import torch

    generator = torch.Generator().manual_seed(0)
    n = BATCH * STEPS * world
    return torch.utils.data.TensorDataset(
        torch.randn(n, WIDTH, generator=generator), torch.randn(n, WIDTH, generator=generator)
    )


def _reset(framework: str) -> None:
    if framework == "accel":
        from accel_state.state import AcceleratorState, GradientState
    else:
        from accelerate.state import AcceleratorState, GradientState
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def _prepared_loop(framework: str) -> tuple[float, dict]:
    import torch
    import torch.distributed as dist

    _reset(framework)
    if framework == "accel":
        from accel_train import Accelerator, DeepSpeedPlugin
    else:
        from accelerate import Accelerator
        from accelerate.utils import DeepSpeedPlugin
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2, gradient_clipping=1.0))
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loader = torch.utils.data.DataLoader(_dataset(accelerator.num_processes), batch_size=BATCH)
    if accelerator.state.deepspeed_plugin is None:  # the reference release on a machine without an accelerator
        raise _Unsupported(f"{framework} did not start DeepSpeed here (its state has no DeepSpeed plugin on CPU)")
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    config = json.loads(json.dumps(accelerator.state.deepspeed_plugin.deepspeed_config, default=float))
    dist.barrier()
    start = time.perf_counter()
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    dist.barrier()
    return time.perf_counter() - start, config


class _Unsupported(Exception):
    """The framework measured does not run DeepSpeed on this machine (said in the output, not a failure)."""


def _by_hand_loop(config: dict) -> float:
    import deepspeed
    import torch
    import torch.distributed as dist

    world = dist.get_world_size()
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config, dist_init_required=False)
    dataset = _dataset(world)
    sampler = torch.utils.data.distributed.DistributedSampler(dataset, shuffle=False)
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=sampler)
    dist.barrier()
    start = time.perf_counter()
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
    dist.barrier()
    return time.perf_counter() - start


def worker(framework: str, repeats: int) -> None:
    import statistics

    import deepspeed
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    try:
        _, config = _prepared_loop(framework)  # warm-up of both, and the resolved config
    except _Unsupported as unsupported:
        if dist.get_rank() == 0:
            print(json.dumps({"unsupported": str(unsupported)}))
        dist.destroy_process_group()
        return
    config["steps_per_print"] = 10**9
    _by_hand_loop(config)
    by_hand, prepared = [], []
    for index in range(repeats):
        if index % 2 == 0:
            by_hand.append(_by_hand_loop(config))
            prepared.append(_prepared_loop(framework)[0])
        else:
            prepared.append(_prepared_loop(framework)[0])
            by_hand.append(_by_hand_loop(config))
    if dist.get_rank() == 0:
        ratios = sorted(h / p for h, p in zip(by_hand, prepared))
        print(
            json.dumps(
                {
                    "by_hand": STEPS / statistics.median(by_hand),
                    "prepared": STEPS / statistics.median(prepared),
                    "ratio": statistics.median(ratios),
                    "added_us": statistics.median((p - h) / STEPS * 1e6 for h, p in zip(by_hand, prepared)),
                }
            )
        )
    dist.destroy_process_group()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run(python: str, framework: str, repeats: int) -> dict:
    command = [
        python,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(_free_port()),
        __file__,
        "--worker",
        framework,
        str(repeats),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "true"}
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=3600, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
    return json.loads([line for line in result.stdout.splitlines() if line.startswith("{")][-1])


def main() -> None:
    sys.path.insert(0, HERE)
    from _common import ratio_line, reference_python, skipped_without

    if skipped_without("deepspeed", hint='install "accel-train[deepspeed]"'):
        return

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--worker", nargs=2, metavar=("FRAMEWORK", "REPEATS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker[0], int(args.worker[1]))
        return
    repeats = 3 if args.quick else 7
    runs = [("accel", sys.executable)]
    reference = reference_python()
    if reference is not None:
        check = subprocess.run([reference, "-c", "import accelerate, deepspeed"], capture_output=True, check=False)
        if check.returncode == 0:
            runs.append(("accelerate", reference))
        else:
            print("reference accelerate (with deepspeed) not installed: only accel is measured")
    else:
        print("reference accelerate not installed (ACCEL_REFERENCE_PYTHON): only accel is measured")
    print(f"ZeRO-2, {WIDTH}-wide 4-layer MLP, batch {BATCH} per process, {STEPS} steps, 2 processes (gloo, CPU)")
    for framework, python in runs:
        result = _run(python, framework, repeats)
        if "unsupported" in result:
            print(f"{framework:<10} not measured: {result['unsupported']}")
            continue
        label = "steps/s: prepared ZeRO-2 / deepspeed.initialize by hand"
        name = label if framework == "accel" else f"reference: {label}"
        ratio_line(name, result["prepared"], result["by_hand"], unit="steps/s", goal=">= 0.97")
        print(
            f"{framework:<10} prepared {result['prepared']:8.2f} steps/s   by hand {result['by_hand']:8.2f} steps/s   "
            f"ratio {result['ratio']:6.3f} (goal >= 0.97)   added {result['added_us']:8.1f} us/step"
        )


if __name__ == "__main__":
    main()
