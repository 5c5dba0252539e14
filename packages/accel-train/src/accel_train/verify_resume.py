"""The resume point of ``accel verify --resume-at K``: what the saving run leaves, what the resumed run reads.

The requested run of ``accel verify --resume-at K`` saves its state after optimizer step ``K`` (through
``accelerator.save_state``) into a folder verify owns, and leaves beside it a small description of that
moment (`ResumePoint`, ``resume.json``) and, per process, the position of each prepared data loader at
the end of step ``K`` (``loaders.<rank>.pt``). A later launch of the same configuration resumes from
them, either by itself (the recorder calls ``load_state`` once the script has prepared as many objects
as the saving run had, then puts each loader back where it stood) or through the script's own resume
code. This module holds the files and the counting; `accel_train.verify_recorder` decides when.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

__all__ = ["ResumePoint", "load_with_positions", "prepared_counts", "save_loader_positions"]

#: The description of the resume point, written by the main process of the saving run.
POINT_FILE = "resume.json"


def prepared_counts(accelerator: Any) -> dict[str, int]:
    """How many objects of each kind ``accelerator`` would save or load now (``load_state`` needs the same
    numbers as the run that saved)."""
    return {
        "models": len(accelerator._models),
        "optimizers": len(accelerator._optimizers),
        "schedulers": len(accelerator._schedulers),
        "dataloaders": len(accelerator._dataloaders),
        "custom objects": len(accelerator._custom_objects),
    }


@dataclass(frozen=True)
class ResumePoint:
    """Where the saving run saved: after optimizer step ``step``, into ``checkpoint``, with ``counts``
    objects prepared (`prepared_counts()`)."""

    step: int
    checkpoint: str
    counts: dict[str, int]

    def write(self, folder: str) -> None:
        """Write ``folder/resume.json`` (the main process only calls this)."""
        partial = os.path.join(folder, POINT_FILE + ".partial")
        with open(partial, "w", encoding="utf-8") as handle:
            json.dump({"step": self.step, "checkpoint": self.checkpoint, "counts": self.counts}, handle, indent=1)
        os.replace(partial, os.path.join(folder, POINT_FILE))

    @classmethod
    def read(cls, folder: str) -> ResumePoint:
        """The resume point the saving run left in ``folder``.

        Raises:
            FileNotFoundError: the saving run left none there (it did not reach its save).
            ValueError: the file is not a resume point.
        """
        path = os.path.join(folder, POINT_FILE)
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"no resume point in {folder} ({POINT_FILE} is missing): the saving run of accel verify "
                "--resume-at did not reach its save"
            )
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
        try:
            return cls(int(data["step"]), str(data["checkpoint"]), {str(k): int(v) for k, v in data["counts"].items()})
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise ValueError(f"{path} is not a resume point written by accel verify ({error!r})") from None

    def describe_difference(self, counts: dict[str, int]) -> str:
        """What ``counts`` lacks or has more of than the saving run had (for the error of a resume that
        never found the objects to load into)."""
        parts = [
            f"{name}: {counts.get(name, 0)} here, {saved} when saved"
            for name, saved in self.counts.items()
            if counts.get(name, 0) != saved
        ]
        return "; ".join(parts) or "the same numbers"


def _loader_file(folder: str, rank: int) -> str:
    return os.path.join(folder, f"loaders.{rank}.pt")


def save_loader_positions(accelerator: Any, folder: str) -> list[dict[str, Any] | None]:
    """Write, for this process, the ``state_dict()`` of each prepared data loader (``None`` for a loader
    without one) as it stands now, the end of the step to resume after; return them."""
    from accel_train.checkpoint.file_io import save_torch

    states = [loader.state_dict() if hasattr(loader, "state_dict") else None for loader in accelerator._dataloaders]
    save_torch(states, _loader_file(folder, accelerator.process_index))
    return states


def load_with_positions(accelerator: Any, checkpoint: str, folder: str) -> int:
    """``accelerator.load_state(checkpoint)`` with each prepared data loader put back where it stood when
    `save_loader_positions()` ran, so that a script that does not skip by itself resumes exactly; return
    how many loaders were positioned.

    The positions go in first, then ``load_state`` restores everything else, the random states last (a
    loader's own ``load_state_dict`` may set torch's generator to its epoch's start, which is not where
    the saving run stood). During the load, loaders that opted in to ``replay_epoch_on_resume`` do not
    rewind to their epoch's start: nothing in an unchanged script would skip the replayed batches.
    """
    from accel_train.checkpoint.file_io import load_torch

    states = load_torch(_loader_file(folder, accelerator.process_index))
    positioned = 0
    for loader, state in zip(accelerator._dataloaders, states):
        if state is not None and hasattr(loader, "load_state_dict"):
            loader.load_state_dict(state)
            positioned += 1
    replaying = [loader for loader in accelerator._dataloaders if getattr(loader, "replay_epoch_on_resume", False)]
    for loader in replaying:
        loader.replay_epoch_on_resume = False
    try:
        accelerator.load_state(checkpoint)
    finally:
        for loader in replaying:
            loader.replay_epoch_on_resume = True
    return positioned
