"""A small training script for the GPU checks, run under ``accel launch`` or ``accelerate launch``.

    accel launch [launcher flags] tools/gpu/train_script.py --framework accel [--fp8] [--steps 20]

The same file runs under both launchers: ``--framework`` picks which ``Accelerator`` it imports, so the
two runs differ only in the library. Rank 0 prints one JSON line: the loss of every step, a checksum
of the final parameters, steps/s over the timed steps, the distributed type and the precision the
library chose, and the model's Linear classes (to show an FP8 conversion happened).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

WIDTH = 2048
DEPTH = 6
BATCH = 32


class Block(torch.nn.Module):
    """One residual MLP block: big enough for real GPU kernels, small enough for a quick check."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(WIDTH)
        self.up = torch.nn.Linear(WIDTH, 2 * WIDTH)
        self.down = torch.nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class Net(torch.nn.Module):
    """``DEPTH`` blocks and a head, with the block class named so FSDP can wrap by it."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(DEPTH))
        self.head = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--framework", choices=("accel", "accelerate"), required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--fp8", action="store_true", help="torchao FP8 through AORecipeKwargs")
    args = parser.parse_args()
    if args.framework == "accel":
        from accel import Accelerator
        from accel.utils import AORecipeKwargs, set_seed
    else:
        from accelerate import Accelerator
        from accelerate.utils import AORecipeKwargs, set_seed

    # the float8 all-gather is an FSDP2 feature; under DeepSpeed it is refused, so ask without it there
    under_deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"
    recipe = AORecipeKwargs(enable_fsdp_float8_all_gather=False) if under_deepspeed else AORecipeKwargs()
    handlers = [recipe] if args.fp8 else []
    accelerator = Accelerator(kwargs_handlers=handlers, **({"mixed_precision": "fp8"} if args.fp8 else {}))
    set_seed(0)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(1)
    n = BATCH * args.steps * accelerator.num_processes
    data = torch.utils.data.TensorDataset(
        torch.randn(n, WIDTH, generator=generator), torch.randn(n, WIDTH, generator=generator)
    )
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    # DeepSpeed runs the model itself in bf16 (no autocast), so float inputs must match its dtype
    cast = (
        torch.bfloat16
        if "DEEPSPEED" in str(accelerator.distributed_type) and accelerator.mixed_precision in ("bf16", "fp8")
        else None
    )
    losses = []
    start = None
    for step, (x, y) in enumerate(loader):
        if step == 3:  # the first steps build kernels and caches
            _sync()
            start = time.perf_counter()
        if cast is not None:
            x = x.to(cast)
        loss = torch.nn.functional.mse_loss(model(x).float(), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.detach())
    _sync()
    seconds = time.perf_counter() - start
    state = accelerator.get_state_dict(model)
    checksum = float(sum(v.float().abs().sum() for v in state.values())) if accelerator.is_main_process else None
    linear_classes = sorted(
        {type(m).__name__ for m in accelerator.unwrap_model(model).modules() if "Linear" in type(m).__name__}
    )
    if accelerator.is_main_process:
        print(
            json.dumps(
                {
                    "framework": args.framework,
                    "distributed_type": str(accelerator.distributed_type),
                    "mixed_precision": str(accelerator.mixed_precision),
                    "device": str(accelerator.device),
                    "losses": [float(v) for v in losses],
                    "checksum": checksum,
                    "steps_per_s": (args.steps - 3) / seconds,
                    "linear_classes": linear_classes,
                    "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None,
                }
            ),
            flush=True,
        )
    accelerator.end_training()


if __name__ == "__main__":
    main()
