"""The training job of the fault tests, started by the real ``accel launch``.

It follows the restart pattern of docs/faults.md: on start, ``load_state()`` when a complete
checkpoint exists; a checkpoint every ``SAVE_EVERY`` batches (mid gradient-accumulation on purpose);
at the end each rank writes its final parameters to ``final_{rank}.safetensors`` in the project
folder, which the tests compare with an uninterrupted run.

Faults come from the environment, so one script serves every test:

- ``FAULTS="attempt:rank:batch:kind,..."``: in restart attempt ``attempt`` (the elastic agent's
  ``TORCHELASTIC_RESTART_COUNT``), rank ``rank`` dies after the backward of global batch ``batch``
  (between two accumulation steps when ``batch`` is odd). ``kind`` is ``kill`` (SIGKILL),
  ``raise`` (an exception) or ``exit`` (``os._exit(137)``, as the OOM killer leaves it). Rank ``*``
  is every rank this launch started (one machine of a multi-machine run).
- ``SLOW_STEP``: seconds to sleep in every batch (gives a test time to send a signal).
- ``PREEMPT_SAVE=1``: opt in to a checkpoint on SIGTERM (``ProjectConfiguration.save_on_preemption``).
- ``MARK_STEPS=1``: rank 0 appends ``attempt batch time`` to ``steps.log`` after every batch.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import torch
from safetensors.torch import save_file

from accel_data import DataLoaderConfiguration
from accel_train import Accelerator, ProjectConfiguration

SAVE_EVERY = 3
EPOCHS = 2


class Progress:
    """Global batch counter saved with the state (``register_for_checkpointing``)."""

    def __init__(self) -> None:
        self.batches = 0

    def state_dict(self) -> dict[str, int]:
        return {"batches": self.batches}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.batches = int(state["batches"])


def parse_faults(text: str) -> dict[tuple[int, int, int], str]:
    """``attempt:rank:batch:kind`` items; rank ``*`` means every rank of this launch (this machine)."""
    faults = {}
    for item in filter(None, text.split(",")):
        attempt, rank, batch, kind = item.split(":")
        faults[(int(attempt), -1 if rank == "*" else int(rank), int(batch))] = kind
    return faults


def die(kind: str) -> None:
    sys.stdout.flush()
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "exit":
        os._exit(137)
    raise RuntimeError("injected failure")


def main() -> None:
    project = sys.argv[1]
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    faults = parse_faults(os.environ.get("FAULTS", ""))
    slow = float(os.environ.get("SLOW_STEP", "0"))
    config = ProjectConfiguration(
        project_dir=project,
        automatic_checkpoint_naming=True,
        total_limit=2,
        save_on_preemption=os.environ.get("PREEMPT_SAVE") == "1",
        continue_numbering_on_load=True,  # a restarted attempt saves after the checkpoint it loaded
    )
    # RESUME_SKIP=continue: the manual resume with accel's replay_epoch_on_resume (the epoch and its order come
    # back, the loop skips the seen batches); otherwise the opt-in: the loader resumes at the saved batch by itself.
    manual_skip = os.environ.get("RESUME_SKIP") == "continue"
    stateful = DataLoaderConfiguration(use_stateful_dataloader=not manual_skip, replay_epoch_on_resume=manual_skip)
    accelerator = Accelerator(gradient_accumulation_steps=2, project_config=config, dataloader_config=stateful)
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(48, 4), torch.randn(48, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=3, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Dropout(0.25), torch.nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.02)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.8)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    progress = Progress()
    accelerator.register_for_checkpointing(progress)
    checkpoints = os.path.join(project, "checkpoints")
    if os.path.isdir(checkpoints) and any(name.startswith("checkpoint_") for name in os.listdir(checkpoints)):
        accelerator.load_state()
        accelerator.print(f"attempt {attempt}: resumed at batch {progress.batches}, epoch {loader.iteration}")
    seen = progress.batches - loader.iteration * len(loader) if manual_skip else 0
    rank = accelerator.process_index
    for _epoch in range(loader.iteration, EPOCHS):
        for index, (inputs, targets) in enumerate(loader):
            if index < seen:
                continue  # trained on before the restart
            with accelerator.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(inputs), targets)
                accelerator.backward(loss)
                progress.batches += 1
                kind = faults.get((attempt, rank, progress.batches)) or faults.get((attempt, -1, progress.batches))
                if kind:
                    die(kind)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            if slow:
                time.sleep(slow)
            if os.environ.get("MARK_STEPS") == "1" and rank == 0:
                with open(os.path.join(project, "steps.log"), "a") as log:
                    log.write(f"{attempt} {progress.batches} {time.time():.6f}\n")
            if progress.batches % SAVE_EVERY == 0:
                accelerator.save_state()
        seen = 0
    state = {k: v.detach().clone().contiguous() for k, v in accelerator.unwrap_model(model).state_dict().items()}
    save_file(state, os.path.join(project, f"final_{rank}.safetensors"))
    accelerator.print(f"DONE attempt {attempt} batches {progress.batches}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
