"""The record `accel verify` compares: what the Accelerator saw at each optimizer step of a run.

`accel verify` (accel-launch) starts the user's script with ``ACCEL_VERIFY_RECORD=<file>`` and
``ACCEL_VERIFY_STEPS=<n>`` in the environment. An Accelerator created there builds one
`VerifyRecorder`; `Accelerator.backward` hands it each loss, and the first prepared optimizer calls it
around each real step (not on accumulation steps; under DeepSpeed, whose engine steps inside
``backward``, when the script calls ``optimizer.step()`` at the boundary). Per optimizer step it keeps
the mean of the losses given to ``backward`` (averaged over the processes), the global gradient norm
just before the step (the strategy's own norm over shards, after any clipping the script did) and the
learning rate of the first parameter group at the step's first ``backward``. After ``n`` steps it gathers the full parameters, writes the record (main
process only), waits for every process and ends the run with ``SystemExit(0)`` on every rank.

The record is JSON (``format`` 1) rewritten after every step with ``complete: false`` until the last,
so a script that ends early or never calls ``backward`` leaves a record that says so. Parameters go to
``<file>.params.pt`` (a plain ``{name: tensor}`` dict readable with ``weights_only=True``).

Without the variable nothing here is imported: the Accelerator checks the environment once, in its
constructor, and its hot paths test one attribute for ``None``.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import torch

__all__ = ["RECORD_VAR", "STEPS_VAR", "VerifyRecorder", "recorder_from_environment"]

#: Path of the JSON record to write (set by `accel verify`; unset: no recording).
RECORD_VAR = "ACCEL_VERIFY_RECORD"
#: How many optimizer steps to record before the run ends.
STEPS_VAR = "ACCEL_VERIFY_STEPS"

RECORD_FORMAT = 1


def recorder_from_environment(accelerator: Any, environ: Any = None) -> VerifyRecorder | None:
    """The recorder `accel verify` asked for in the environment, or ``None`` when it did not ask.

    Raises:
        ValueError: ``ACCEL_VERIFY_STEPS`` is not a whole number of at least 1.
    """
    env = os.environ if environ is None else environ
    path = env.get(RECORD_VAR)
    if not path:
        return None
    raw = env.get(STEPS_VAR, "5")
    try:
        steps = int(raw)
    except ValueError:
        steps = 0
    if steps < 1:
        raise ValueError(f"{STEPS_VAR}={raw!r}: the number of optimizer steps to record must be a whole number >= 1")
    return VerifyRecorder(accelerator, path, steps)


class VerifyRecorder:
    """Keeps the per-step quantities of one run and writes them for `accel verify`.

    Args:
        accelerator: the Accelerator of the run (its strategy gives norms and gathered weights).
        path: where the main process writes the JSON record.
        steps: how many optimizer steps to record before ending the run.
    """

    def __init__(self, accelerator: Any, path: str, steps: int) -> None:
        self.accelerator = accelerator
        self.path = path
        self.steps = steps
        self.backward_calls = 0
        self.records: list[dict[str, Any]] = []
        self._losses: list[float] = []
        self._pending: dict[str, Any] = {}
        self._lr: float | None = None
        self._optimizer: Any = None
        self._write(complete=False)

    # -- hooks ----------------------------------------------------------------------------------------

    def attach(self, optimizer: Any) -> None:
        """Follow ``optimizer``'s steps (the first prepared optimizer only: its steps are the ones counted)."""
        if self._optimizer is None:
            self._optimizer = optimizer
            optimizer._verify_hook = self

    def on_backward(self, loss: torch.Tensor) -> None:
        """Note the loss given to ``accelerator.backward`` (before the division by the accumulation steps)."""
        self.backward_calls += 1
        if not self._losses and self._optimizer is not None:
            # the rate this step uses, read before anything can step a scheduler (DeepSpeed's engine
            # steps its optimizer and scheduler inside backward)
            groups = self._optimizer.param_groups
            self._lr = _number(groups[0].get("lr")) if groups else None
        self._losses.append(float(loss.detach().float().mean().item()))
        if self.backward_calls == 1:
            self._write(complete=False)

    def before_step(self, optimizer: Any) -> None:
        """Note the global gradient norm the step is about to use."""
        self._pending = {"grad_norm": self._grad_norm(optimizer), "lr": self._lr}

    def after_step(self, optimizer: Any) -> None:
        """Close the step: average the loss over processes, write the record, end the run after the last one."""
        loss = _mean_over_processes(sum(self._losses) / len(self._losses)) if self._losses else None
        self._losses = []
        self.records.append({"step": len(self.records) + 1, "loss": loss, **self._pending})
        self._pending = {}
        if len(self.records) < self.steps:
            self._write(complete=False)
            return
        self._finish()

    # -- internals ------------------------------------------------------------------------------------

    def _grad_norm(self, optimizer: Any) -> float | None:
        """The strategy's norm of every gradient (over all shards), or ``None`` where taking it could
        change the run: an fp16 scaler (unscaling twice is an error) or a backend that keeps its own."""
        if getattr(optimizer, "scaler", None) is not None or self.accelerator.distributed_type.name == "DEEPSPEED":
            return None
        params = [p for group in optimizer.param_groups for p in group["params"]]
        # max_norm=inf: the clip coefficient is clamped to 1, so the gradients are left as they are.
        norm = self.accelerator.clip_grad_norm_(params, math.inf)
        return None if norm is None else _number(norm)

    def _finish(self) -> None:
        accelerator = self.accelerator
        weights: dict[str, torch.Tensor] = {}
        models = list(accelerator._models)
        for index, model in enumerate(models):
            prefix = "" if len(models) == 1 else f"model{index}."
            for name, value in accelerator.get_state_dict(model).items():
                if isinstance(value, torch.Tensor):
                    weights[prefix + name] = value.detach().to("cpu", torch.float32).contiguous()
        if accelerator.is_main_process:
            from accel_train.checkpoint.file_io import save_torch

            save_torch(weights, self.path + ".params.pt")
        self._write(complete=True)
        accelerator.wait_for_everyone()
        raise SystemExit(0)

    def _write(self, complete: bool) -> None:
        if not self.accelerator.is_main_process:
            return
        record = {
            "format": RECORD_FORMAT,
            "complete": complete,
            "steps_requested": self.steps,
            "backward_calls": self.backward_calls,
            "num_processes": self.accelerator.num_processes,
            "distributed_type": self.accelerator.distributed_type.name,
            "mixed_precision": str(self.accelerator.mixed_precision),
            "steps": self.records,
            "params_file": os.path.basename(self.path) + ".params.pt" if complete else None,
        }
        partial = self.path + ".partial"
        with open(partial, "w", encoding="utf-8") as handle:
            json.dump(record, handle, indent=1)
        os.replace(partial, self.path)


def _number(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        if hasattr(value, "full_tensor"):
            value = value.full_tensor()
        value = value.detach().float().item()
    return float(value)


def _mean_over_processes(value: float) -> float:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return value
    tensor = torch.tensor([value], dtype=torch.float64)
    backend = dist.get_backend()
    if backend == "nccl":
        tensor = tensor.cuda()
    dist.all_reduce(tensor)
    return float(tensor.item()) / dist.get_world_size()
