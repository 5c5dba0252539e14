"""What a script written for the documented system reads after ``load_state``: batches and random draws.

Run as ``resume_order_job.py PHASE FOLDER SAVE_EPOCH SAVE_STEP [seedable] [stateful] [replay]`` on accel, or with
``RESUME_ORDER_LIB=accelerate`` on the documented system (``tools/record_resume_order_reference.py``
records its figures there). More cases may follow, each after a ``--`` (``FOLDER SAVE_EPOCH SAVE_STEP
[options]``): the process runs them one after another, each from ``set_seed(0)`` with an ``Accelerator``
and a loader of its own, so that one launch serves several cases. ``save`` runs three epochs of a
shuffled loader and saves the state after ``SAVE_STEP`` batches of epoch ``SAVE_EPOCH``; ``resume`` loads that state and goes on as the
documented checkpointing guide does: ``skip_first_batches`` for the rest of the interrupted epoch, the
prepared loader after it (with ``stateful``, ``use_stateful_dataloader=True``: the loader alone). Each process writes ``FOLDER/PHASE.RANK.json``: one ``[epoch, step, batch,
draw]`` per step, ``draw`` a number taken from torch's generator at the step (as dropout would).
"""

from __future__ import annotations

import json
import os
import sys

import torch

if os.environ.get("RESUME_ORDER_LIB") == "accelerate":
    from accelerate import Accelerator, DataLoaderConfiguration
    from accelerate.utils import set_seed
else:
    from accel_data import DataLoaderConfiguration
    from accel_state.random import set_seed
    from accel_train import Accelerator

EPOCHS = 3
#: name -> (processes, save epoch, save step, options): the cases compared with the documented system
REFERENCE_CASES: dict[str, tuple[int, int, int, tuple[str, ...]]] = {
    "one-process-epoch-1": (1, 1, 2, ()),
    "one-process-seedable-epoch-1": (1, 1, 2, ("seedable",)),
    "two-processes-epoch-0": (2, 0, 3, ()),
    "two-processes-seedable-epoch-1": (2, 1, 2, ("seedable",)),
}
#: use_stateful_dataloader=True (recorded too): accel's resume continues the uninterrupted run exactly, the
#: documented system's 1.15 does not; on one process accel's loader shuffles with a generator of its own
STATEFUL_CASES: dict[str, tuple[int, int, int, tuple[str, ...]]] = {
    "one-process-stateful-epoch-1": (1, 1, 2, ("stateful",)),
    "two-processes-stateful-epoch-1": (2, 1, 2, ("stateful",)),
}
#: accel's replay opt-in, which the documented system lacks: the resumed run equals the uninterrupted one
REPLAY_CASES: dict[str, tuple[int, int, int, tuple[str, ...]]] = {
    "one-process-replay-epoch-1": (1, 1, 2, ("replay",)),
    "two-processes-seedable-replay-epoch-1": (2, 1, 2, ("seedable", "replay")),
}


PHASES = ("save", "resume")


def read_logs(folder: str, processes: int) -> dict[str, dict[str, list]]:
    """What both phases of a case wrote into ``folder``: ``{phase: {rank: log}}``."""
    logs: dict[str, dict[str, list]] = {}
    for phase in PHASES:
        logs[phase] = {}
        for rank in range(processes):
            with open(os.path.join(folder, f"{phase}.{rank}.json")) as handle:
                logs[phase][str(rank)] = json.load(handle)
    return logs


def run(phase: str, folder: str, save_epoch: int, save_step: int, options: set[str]) -> Accelerator:
    """One case's phase; returns its ``Accelerator`` (the caller ends the training)."""
    config = {"use_seedable_sampler": "seedable" in options, "use_stateful_dataloader": "stateful" in options}
    if "replay" in options:
        config["replay_epoch_on_resume"] = True  # accel's opt-in (the documented system has none)
    set_seed(0)
    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(**config))
    loader = accelerator.prepare(torch.utils.data.DataLoader(list(range(16)), batch_size=2, shuffle=True))
    checkpoint = os.path.join(folder, "checkpoint")
    first_epoch = 0
    if phase == "resume":
        accelerator.load_state(checkpoint)
        first_epoch = save_epoch
    log = []
    for epoch in range(first_epoch, EPOCHS):
        resuming = phase == "resume" and epoch == save_epoch
        # a stateful loader continues at the saved batch by itself: the script does not skip
        skip = resuming and "stateful" not in options
        batches = accelerator.skip_first_batches(loader, save_step) if skip else loader
        for step, batch in enumerate(batches, start=save_step if resuming else 0):
            log.append([epoch, step, batch.tolist(), round(torch.rand(1).item(), 8)])
            if phase == "save" and (epoch, step + 1) == (save_epoch, save_step):
                accelerator.save_state(checkpoint)
    with open(os.path.join(folder, f"{phase}.{accelerator.process_index}.json"), "w") as handle:
        json.dump(log, handle)
    return accelerator


def main() -> None:
    phase, rest = sys.argv[1], sys.argv[2:]
    cases: list[list[str]] = [[]]
    for arg in rest:
        if arg == "--":
            cases.append([])
        else:
            cases[-1].append(arg)
    accelerator = None
    for folder, save_epoch, save_step, *options in cases:
        accelerator = run(phase, folder, int(save_epoch), int(save_step), set(options))
    assert accelerator is not None
    accelerator.end_training()


if __name__ == "__main__":
    main()
