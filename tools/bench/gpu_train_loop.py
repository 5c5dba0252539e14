"""Training steps per second on one GPU: the Accelerator's prepared loop against plain PyTorch.

    python tools/bench/gpu_train_loop.py [--steps 60] [--repeats 5] [--json OUT]

Needs CUDA; without it the script says so and exits 0 (CI has no GPU). For each mixed-precision mode
(``no``, ``bf16``, ``fp16``) one process runs three loops over the same model, data and seed,
alternating their order on every repeat so that clock and thermal drift hit all of them alike:

- plain PyTorch driven by hand (``torch.autocast`` and, for fp16, ``torch.amp.GradScaler``);
- the loop prepared by accel's ``Accelerator``;
- the same loop prepared by the reference ``accelerate`` release, when it is importable.

It prints steps/s, the ratio prepared/plain (goal >= 0.98) and accel/reference, and the largest
difference between the loss sequences of the prepared loops and the plain one: the same kernels run
in the same order, so the losses should agree exactly.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

WIDTH = 4096
DEPTH = 8
BATCH = 64


def _model() -> Any:
    import torch

    torch.manual_seed(0)
    layers: list[Any] = []
    for _ in range(DEPTH):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU()]
    return torch.nn.Sequential(*layers[:-1])


def _loader(steps: int) -> Any:
    import torch

    generator = torch.Generator().manual_seed(0)
    n = BATCH * steps
    data = torch.utils.data.TensorDataset(
        torch.randn(n, WIDTH, generator=generator), torch.randn(n, WIDTH, generator=generator)
    )
    return torch.utils.data.DataLoader(data, batch_size=BATCH, pin_memory=True)


def plain_loop(mode: str, steps: int) -> tuple[float, list[float]]:
    """The loop in plain PyTorch: returns (seconds, losses)."""
    import torch

    device = torch.device("cuda")
    model = _model().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mode)
    scaler = torch.amp.GradScaler("cuda") if mode == "fp16" else None
    losses: list[torch.Tensor] = []
    torch.cuda.synchronize()
    start = time.perf_counter()
    for x, y in _loader(steps):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        context = torch.autocast("cuda", dtype=dtype) if dtype is not None else contextlib.nullcontext()
        with context:
            loss = torch.nn.functional.mse_loss(model(x), y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.detach())
    torch.cuda.synchronize()
    return time.perf_counter() - start, [float(v) for v in losses]


def prepared_loop(framework: str, mode: str, steps: int) -> tuple[float, list[float]]:
    """The loop prepared by ``framework`` ("accel" or "accelerate"): returns (seconds, losses)."""
    import torch

    if framework == "accel":
        from accel_state.state import AcceleratorState, GradientState
        from accel_train import Accelerator
    else:
        from accelerate import Accelerator
        from accelerate.state import AcceleratorState, GradientState
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    accelerator = Accelerator(mixed_precision=mode)
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, _loader(steps))
    losses: list[torch.Tensor] = []
    torch.cuda.synchronize()
    start = time.perf_counter()
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.detach())
    torch.cuda.synchronize()
    return time.perf_counter() - start, [float(v) for v in losses]


def _reference_available() -> bool:
    try:
        import accelerate  # noqa: F401
    except ImportError:
        return False
    return True


def measure(mode: str, steps: int, repeats: int) -> dict[str, Any]:
    """Steps/s and loss agreement of every loop for one precision mode."""
    loops: dict[str, Callable[[], tuple[float, list[float]]]] = {
        "plain": lambda: plain_loop(mode, steps),
        "accel": lambda: prepared_loop("accel", mode, steps),
    }
    if _reference_available():
        loops["accelerate"] = lambda: prepared_loop("accelerate", mode, steps)
    for run in loops.values():  # warm-up: cuBLAS handles, allocator, autotuning
        run()
    times: dict[str, list[float]] = {name: [] for name in loops}
    losses: dict[str, list[float]] = {}
    names = list(loops)
    for index in range(repeats):
        order = names[index % len(names) :] + names[: index % len(names)]
        for name in order:
            seconds, losses[name] = loops[name]()
            times[name].append(seconds)
    result: dict[str, Any] = {"mode": mode, "steps": steps}
    for name in names:
        result[f"{name}_steps_per_s"] = steps / min(times[name])
    result["accel_over_plain"] = statistics.median(p / a for p, a in zip(times["plain"], times["accel"]))
    result["accel_loss_max_diff"] = max(abs(a - b) for a, b in zip(losses["accel"], losses["plain"]))
    if "accelerate" in loops:
        result["reference_over_plain"] = statistics.median(p / r for p, r in zip(times["plain"], times["accelerate"]))
        result["accel_over_reference"] = statistics.median(r / a for r, a in zip(times["accelerate"], times["accel"]))
        result["reference_loss_max_diff"] = max(abs(a - b) for a, b in zip(losses["accelerate"], losses["plain"]))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--modes", default="no,bf16,fp16")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gpu_train_loop: no CUDA device here; nothing measured")
        return
    from _common import ratio_line

    print(f"device: {torch.cuda.get_device_name(0)}  torch {torch.__version__}  model {DEPTH}x{WIDTH}, batch {BATCH}")
    results = [measure(mode, args.steps, args.repeats) for mode in args.modes.split(",")]
    for result in results:
        print(json.dumps(result))
        mode = result["mode"]
        print(
            ratio_line(
                f"gpu loop {mode}: accel / plain",
                result["accel_steps_per_s"],
                result["plain_steps_per_s"],
                "steps/s",
                ">= 0.98",
            )
        )
        if "accelerate_steps_per_s" in result:
            print(
                ratio_line(
                    f"gpu loop {mode}: accel / accelerate",
                    result["accel_steps_per_s"],
                    result["accelerate_steps_per_s"],
                    "steps/s",
                    ">= 1.0",
                )
            )
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
