"""A training script that can be stopped at any moment and started again where it was.

    accel launch --cpu --num_processes 2 examples/resumable_training.py --project_dir /tmp/run
    # stop it (Ctrl-C, a preempted node, --crash_at_step 7), then run the same command again

Every ``--save_every`` optimizer steps it saves a numbered checkpoint
(``<project_dir>/checkpoints/checkpoint_<n>``, the two newest kept). On start it loads the newest
complete one when there is one: model, optimizer, scheduler, the position of the data loader in
its epoch, the random generators and the step counter, so the restarted run continues with the same
batches and the same random numbers it would have drawn. At the end it prints a fingerprint of
the weights: a run that was stopped and resumed prints the same fingerprint as one that was not.
"""

from __future__ import annotations

import argparse
import hashlib
import os

import torch
from torch import nn

from accel import Accelerator
from accel.utils import DataLoaderConfiguration, ProjectConfiguration


class TrainingProgress:
    """The counters of the run, saved with every checkpoint (``register_for_checkpointing``)."""

    def __init__(self) -> None:
        self.step = 0
        self.epoch = 0

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step, "epoch": self.epoch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.step, self.epoch = int(state["step"]), int(state["epoch"])


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project_dir", required=True, help="checkpoints go to <project_dir>/checkpoints")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=8, help="per process")
    parser.add_argument("--save_every", type=int, default=7, help="optimizer steps between checkpoints")
    parser.add_argument("--crash_at_step", type=int, default=None, help="exit abruptly at this step (to test resume)")
    parser.add_argument("--mixed_precision", default="no", choices=["no", "fp16", "bf16"])
    return parser.parse_args()


def fingerprint(model: nn.Module) -> str:
    """A short hash of every weight, identical only for bit-identical models."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def main() -> None:
    args = parse_args()
    # continue_numbering_on_load=True (accel's opt-in): after load_state() of checkpoint_<n> the next save is
    # checkpoint_<n+1>; by default, as in Hugging Face Accelerate, loading leaves the numbering at 0.
    config = ProjectConfiguration(
        project_dir=args.project_dir, automatic_checkpoint_naming=True, total_limit=2, continue_numbering_on_load=True
    )
    # use_stateful_dataloader=True: load_state also brings back the loader's position in the epoch.
    dataloader_config = DataLoaderConfiguration(use_stateful_dataloader=True)
    accelerator = Accelerator(
        project_config=config, mixed_precision=args.mixed_precision, dataloader_config=dataloader_config
    )

    torch.manual_seed(0)
    inputs = torch.randn(320, 10)
    data = torch.utils.data.TensorDataset(inputs, (inputs[:, :3].sum(dim=1) > 0).long())
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch_size, shuffle=True)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs * len(loader))
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    progress = TrainingProgress()
    accelerator.register_for_checkpointing(progress)

    checkpoints = os.path.join(args.project_dir, "checkpoints")
    if os.path.isdir(checkpoints) and any(name.startswith("checkpoint_") for name in os.listdir(checkpoints)):
        accelerator.load_state()  # the newest complete checkpoint
        accelerator.print(f"resumed at step {progress.step} (epoch {progress.epoch + 1})")
    else:
        accelerator.print("starting from scratch")

    while progress.epoch < args.epochs:
        for features, labels in loader:  # after a resume, the loader starts at the next unseen batch
            loss = nn.functional.cross_entropy(model(features), labels)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            progress.step += 1
            if progress.step == args.crash_at_step:
                accelerator.print(f"crashing at step {progress.step}", flush=True)
                os._exit(3)  # as abrupt as a killed process: no clean-up, no save
            if progress.step % args.save_every == 0:
                accelerator.save_state()
        progress.epoch += 1
        accelerator.print(f"epoch {progress.epoch}: loss {loss.item():.4f}, step {progress.step}")

    accelerator.wait_for_everyone()
    accelerator.print(
        f"finished at step {progress.step}; weights fingerprint {fingerprint(accelerator.unwrap_model(model))}"
    )
    accelerator.end_training()


if __name__ == "__main__":
    main()
