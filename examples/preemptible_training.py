"""A training script that survives restarts and preemption (docs/faults.md).

    accel launch --cpu --num_processes 2 --max_restarts 3 examples/preemptible_training.py --project_dir runs/resumable
    python examples/preemptible_training.py            # one process works too

Kill a worker while it runs (``kill -9 <pid of a worker>``): the launcher restarts the group and the
script continues from its latest complete checkpoint, ending with the same parameters as a run that
was never interrupted. Send SIGTERM to the launcher: the current step finishes, a checkpoint is saved,
the launcher exits with status 143, and the next start resumes from it. ``--kill_at N`` makes the last
process kill itself after batch N of the first attempt, to see a restart without a second terminal.
"""

from __future__ import annotations

import argparse
import os
import signal

import torch
from torch import nn

from accel import Accelerator
from accel.utils import DataLoaderConfiguration, ProjectConfiguration


class Progress:
    """What the loop itself needs after a restart: the epoch and the step given to the trackers."""

    def __init__(self) -> None:
        self.epoch = 0
        self.step = 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.step = int(state["epoch"]), int(state["step"])


def make_data(num_samples: int = 512) -> torch.utils.data.TensorDataset:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(num_samples, 16, generator=generator)
    y = (x[:, :4].sum(dim=1, keepdim=True) > 0).float()
    return torch.utils.data.TensorDataset(x, y)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project_dir", default="runs/resumable")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--save_every", type=int, default=10)
    parser.add_argument("--kill_at", type=int, default=0)
    args = parser.parse_args()

    config = ProjectConfiguration(
        project_dir=args.project_dir,
        automatic_checkpoint_naming=True,
        total_limit=3,
        save_on_preemption=True,  # SIGTERM: finish the step, save, exit 143
        continue_numbering_on_load=True,  # after load_state() of checkpoint_<n>, save checkpoint_<n+1>
    )
    # use_stateful_dataloader=True: after load_state the loader continues at the saved batch (the loop
    # below does not skip by hand; without it the interrupted epoch replays from its start).
    dataloader_config = DataLoaderConfiguration(use_stateful_dataloader=True)
    accelerator = Accelerator(gradient_accumulation_steps=2, project_config=config, dataloader_config=dataloader_config)
    torch.manual_seed(42)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(make_data(), batch_size=16, shuffle=True)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs * len(loader))
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    progress = Progress()
    accelerator.register_for_checkpointing(progress)

    checkpoints = os.path.join(args.project_dir, "checkpoints")
    if os.path.isdir(checkpoints) and os.listdir(checkpoints):
        accelerator.load_state()  # model, optimizer, scheduler, RNG, loader position, accumulation, progress
        accelerator.print(f"resumed at epoch {progress.epoch}, step {progress.step}")

    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    loss_fn = nn.BCEWithLogitsLoss()
    for epoch in range(progress.epoch, args.epochs):
        for x, y in loader:  # continues at the next batch after a resume
            with accelerator.accumulate(model):
                loss = loss_fn(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            progress.step += 1
            if args.kill_at and attempt == 0 and progress.step == args.kill_at and accelerator.is_last_process:
                os.kill(os.getpid(), signal.SIGKILL)
            if progress.step % args.save_every == 0:
                accelerator.save_state()
        progress.epoch = epoch + 1
        accelerator.print(f"epoch {epoch}: loss {loss.item():.4f} (step {progress.step})")
    accelerator.save_state()
    checksum = sum(p.double().sum().item() for p in accelerator.unwrap_model(model).parameters())
    accelerator.print(f"done: {progress.step} steps, parameter checksum {checksum:.10f}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
