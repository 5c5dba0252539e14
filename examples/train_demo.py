"""Train a small classifier with accel: the script to start from.

    accel launch --cpu --num_processes 2 examples/train_demo.py
    python examples/train_demo.py            # one process works too

What it shows, in order: a model trained on generated data with bf16 autocast and gradient
accumulation; losses logged to a JSON-lines tracker; evaluation through ``gather_for_metrics``
(every sample counted once, even though the evaluation set does not split evenly); a checkpoint
saved mid-epoch and training resumed from it, as after a crash; the trained model saved with
``save_model`` (sharded safetensors) and loaded back with ``load_checkpoint_and_dispatch`` with
part of it on disk, its outputs checked against the trained model.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import time

import torch
from torch import nn

from accel import Accelerator, init_empty_weights, load_checkpoint_and_dispatch
from accel.utils import ProjectConfiguration, broadcast_object_list

NUM_CLASSES = 4
FEATURES = 16


def make_data(num_samples: int, seed: int) -> torch.utils.data.TensorDataset:
    """Points around four centres in 16 dimensions, labelled by their centre (with some overlap)."""
    generator = torch.Generator().manual_seed(seed)
    centres = torch.randn(NUM_CLASSES, FEATURES, generator=torch.Generator().manual_seed(0)) * 0.6
    labels = torch.randint(0, NUM_CLASSES, (num_samples,), generator=generator)
    points = centres[labels] + torch.randn(num_samples, FEATURES, generator=generator)
    return torch.utils.data.TensorDataset(points, labels)


class Classifier(nn.Module):
    def __init__(self, hidden: int = 64) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(FEATURES, hidden),
            nn.GELU(),
            nn.Dropout(0.1),
            nn.Linear(hidden, hidden),
            nn.GELU(),
            nn.Linear(hidden, NUM_CLASSES),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output_dir", default=os.path.join(tempfile.gettempdir(), "accel_train_demo"))
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=16, help="per process")
    parser.add_argument("--gradient_accumulation_steps", type=int, default=2)
    parser.add_argument("--mixed_precision", default="bf16", choices=["no", "fp16", "bf16"])
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=42)
    return parser.parse_args()


def build(accelerator: Accelerator, args: argparse.Namespace):
    """Model, optimizer, loaders and scheduler, prepared (called again to simulate a restart)."""
    torch.manual_seed(args.seed)
    model = Classifier()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    train_loader = torch.utils.data.DataLoader(make_data(1024, seed=1), batch_size=args.batch_size, shuffle=True)
    eval_loader = torch.utils.data.DataLoader(make_data(501, seed=2), batch_size=64)
    steps = args.epochs * math.ceil(len(train_loader) / accelerator.num_processes / args.gradient_accumulation_steps)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=args.lr, total_steps=steps * accelerator.num_processes + 1
    )
    return accelerator.prepare(model, optimizer, train_loader, eval_loader, scheduler)


def evaluate(accelerator: Accelerator, model: nn.Module, loader) -> tuple[float, int]:
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for points, labels in loader:
            predictions = model(points).argmax(dim=-1)
            predictions, labels = accelerator.gather_for_metrics((predictions, labels))
            correct += int((predictions == labels).sum())
            total += labels.numel()
    model.train()
    return correct / total, total


def progress(accelerator: Accelerator, total: int, description: str, initial: int = 0):
    """A progress bar on the local main process (None elsewhere, or without tqdm); a resumed epoch's
    bar starts at the batch where it resumes, not at 0%."""
    if accelerator.is_local_main_process:
        try:
            from tqdm.auto import tqdm

            return tqdm(total=total, initial=initial, desc=description, dynamic_ncols=True, leave=True, mininterval=0.5)
        except ImportError:
            pass
    return None


def train_epoch(accelerator, model, optimizer, loader, scheduler, epoch, args, stop_after=None, state=None):
    """One epoch (or until ``stop_after`` batches); returns the mean loss of the batches seen."""
    resumed = (state or {}).get("resumed_batches", 0)
    bar = progress(accelerator, len(loader), f"epoch {epoch + 1}/{args.epochs}", initial=resumed)
    if resumed:  # after load_state the loader starts its epoch from the first batch: skip those already trained on
        loader = accelerator.skip_first_batches(loader, resumed)
    losses = []
    for batch_index, (points, labels) in enumerate(loader):
        with accelerator.accumulate(model):
            loss = nn.functional.cross_entropy(model(points), labels)
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        losses.append(loss.item())
        if accelerator.sync_gradients:
            state["global_step"] += 1
            accelerator.log({"train_loss": loss.item(), "lr": scheduler.get_last_lr()[0]}, step=state["global_step"])
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{sum(losses[-20:]) / len(losses[-20:]):.3f}")
        if stop_after is not None and batch_index + 1 == stop_after:
            break
    if bar is not None:
        bar.close()
    return sum(losses) / max(1, len(losses))


def main() -> None:
    args = parse_args()
    config = ProjectConfiguration(project_dir=args.output_dir, automatic_checkpoint_naming=True, total_limit=2)
    accelerator = Accelerator(
        mixed_precision=args.mixed_precision,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        log_with="jsonl",
        project_config=config,
    )
    # Each run gets its own folder (checkpoints, logs, model), named on the main process.
    run_name = broadcast_object_list([time.strftime("run_%Y%m%d-%H%M%S")])[0]
    run_dir = os.path.join(args.output_dir, run_name)
    accelerator.project_configuration.set_directories(run_dir)
    accelerator.print(
        f"accel demo: {accelerator.num_processes} process(es), {accelerator.distributed_type.value}, device {accelerator.device}, "
        f"mixed precision {accelerator.mixed_precision}, gradient accumulation {args.gradient_accumulation_steps}"
    )
    accelerator.init_trackers("train_demo", config=vars(args))
    model, optimizer, train_loader, eval_loader, scheduler = build(accelerator, args)
    state = {"global_step": 0}

    accuracy, counted = evaluate(accelerator, model, eval_loader)
    accelerator.print(f"before training: accuracy {accuracy:.1%} on {counted} evaluation samples")

    # Epoch 1, then half of epoch 2: save a checkpoint there, as a long job does regularly.
    first_loss = train_epoch(accelerator, model, optimizer, train_loader, scheduler, 0, args, state=state)
    accuracy, _ = evaluate(accelerator, model, eval_loader)
    accelerator.log({"eval_accuracy": accuracy}, step=state["global_step"])
    accelerator.print(f"epoch 1: mean loss {first_loss:.4f}, accuracy {accuracy:.1%}")
    half = len(train_loader) // 2
    train_epoch(accelerator, model, optimizer, train_loader, scheduler, 1, args, stop_after=half, state=state)
    checkpoint = accelerator.save_state()
    accelerator.print(f"checkpoint saved mid-epoch (batch {half} of {len(train_loader)}) to {checkpoint}")

    # Simulate a restart: fresh objects, then load_state() picks the latest checkpoint; train_epoch
    # skips the batches of the epoch already trained on (skip_first_batches).
    saved_params = [p.detach().clone() for p in accelerator.unwrap_model(model).parameters()]
    accelerator.free_memory()
    model, optimizer, train_loader, eval_loader, scheduler = build(accelerator, args)
    accelerator.load_state()
    restored = all(torch.equal(a, b) for a, b in zip(saved_params, accelerator.unwrap_model(model).parameters()))
    if not restored:
        raise SystemExit("resume failed: the parameters differ from the checkpoint")
    accelerator.print(f"resumed from {checkpoint}: parameters identical, continuing at batch {half + 1}")
    state["resumed_batches"] = half
    losses = []
    for epoch in range(1, args.epochs):
        losses.append(train_epoch(accelerator, model, optimizer, train_loader, scheduler, epoch, args, state=state))
        state["resumed_batches"] = 0
        accuracy, counted = evaluate(accelerator, model, eval_loader)
        accelerator.log({"eval_accuracy": accuracy}, step=state["global_step"])
        accelerator.print(f"epoch {epoch + 1}: mean loss {losses[-1]:.4f}, accuracy {accuracy:.1%}")
    if not losses[-1] < first_loss:
        raise SystemExit(f"the loss did not go down: {first_loss:.4f} -> {losses[-1]:.4f}")
    accelerator.print(f"final accuracy {accuracy:.1%} on {counted} evaluation samples (each counted once)")

    # Save the trained model (sharded safetensors) and load it back with part of it on disk.
    model_dir = os.path.join(run_dir, "model")
    accelerator.wait_for_everyone()
    accelerator.save_model(model, model_dir, max_shard_size="8KB")
    if accelerator.is_main_process:
        trained = accelerator.unwrap_model(model, keep_fp32_wrapper=False).eval()
        with init_empty_weights():
            reloaded = Classifier()
        device_map = {"net.0": "cpu", "net.3": "disk", "net.5": "cpu"}
        reloaded = load_checkpoint_and_dispatch(
            reloaded, model_dir, device_map=device_map, offload_folder=os.path.join(run_dir, "offload")
        )
        reloaded.eval()
        points = make_data(64, seed=3).tensors[0]
        with torch.no_grad():
            expected, got = trained(points), reloaded(points)
        if not torch.allclose(expected, got, atol=1e-5):
            raise SystemExit("the reloaded model's outputs differ from the trained model's")
        shards = sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors"))
        print(
            f"model saved to {model_dir} ({len(shards)} safetensors shards + index); reloaded with "
            f"load_checkpoint_and_dispatch, layer net.3 on disk: outputs match (max diff {(expected - got).abs().max():.1e})"
        )
    accelerator.end_training()
    if accelerator.is_main_process:
        print(f"checkpoints: {os.path.join(run_dir, 'checkpoints')}")
        print(f"logs: {os.path.join(run_dir, 'train_demo.jsonl')}")


if __name__ == "__main__":
    main()
