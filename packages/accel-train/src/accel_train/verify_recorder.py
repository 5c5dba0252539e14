"""The record `accel verify` compares: what the Accelerator saw at each optimizer step of a run.

`accel verify` (accel-launch) starts the user's script with ``ACCEL_VERIFY_RECORD=<file>`` and
``ACCEL_VERIFY_STEPS=<n>`` in the environment. An Accelerator created there builds one
`VerifyRecorder`; `Accelerator.backward` hands it each loss, and the first prepared optimizer calls it
around each real step (not on accumulation steps; under DeepSpeed, whose engine steps inside
``backward``, when the script calls ``optimizer.step()`` at the boundary). Per optimizer step it keeps
the mean of the losses given to ``backward`` (averaged over the processes), the global gradient norm
just before the step (the strategy's own norm over shards, after any clipping the script did) and the
learning rate of the first parameter group at the step's first ``backward``. A script that steps an
optimizer it never passed to ``prepare`` is followed too (through torch's global optimizer hooks, from its
first ``backward``), and the record says so (``optimizer_prepared: false``): under FSDP, DeepSpeed or tensor
parallelism such an optimizer updates parameters the prepared model no longer uses. After ``n`` steps it gathers the full parameters, writes the record (main
process only), waits for every process and ends the run with ``SystemExit(0)`` on every rank.

The record is JSON (``format`` 1) rewritten after every step with ``complete: false`` until the last,
so a script that ends early or never calls ``backward`` leaves a record that says so. Parameters go to
``<file>.params.pt`` (a plain ``{name: tensor}`` dict readable with ``weights_only=True``).

``accel verify --resume-at K`` adds two things. In the requested run (``ACCEL_VERIFY_SAVE_AT=K``,
``ACCEL_VERIFY_RESUME_DIR=<folder>``) the recorder notes each loader's position at the end of step ``K``
and saves the state (``accelerator.save_state`` into ``<folder>/state``) when the script next zeroes the
gradients through the prepared optimizer (after its scheduler stepped; if it never does, before the next
``backward``), then the run goes on. In the resumed run (``ACCEL_VERIFY_RESUME=recorder`` or ``script``
in addition) the steps are numbered from ``K + 1``: with ``recorder`` it calls ``load_state`` as soon as
the script has prepared as many models, optimizers, schedulers, loaders and registered objects as the
saving run had, and puts every loader back at its saved position, so the script needs no change; with
``script`` the script resumes by itself (its own ``load_state`` and skip) and must have called
``load_state`` before its first ``backward``. `accel_train.verify_resume` holds the files.

Without the variable nothing here is imported: the Accelerator checks the environment once, in its
constructor, and its hot paths test one attribute for ``None``.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import torch

__all__ = [
    "RECORD_VAR",
    "RESUME_DIR_VAR",
    "RESUME_VAR",
    "SAVE_AT_VAR",
    "STEPS_VAR",
    "VerifyRecorder",
    "recorder_from_environment",
]

#: Path of the JSON record to write (set by `accel verify`; unset: no recording).
RECORD_VAR = "ACCEL_VERIFY_RECORD"
#: How many optimizer steps to record before the run ends.
STEPS_VAR = "ACCEL_VERIFY_STEPS"
#: `accel verify --resume-at K`: save the state after optimizer step K (the requested run).
SAVE_AT_VAR = "ACCEL_VERIFY_SAVE_AT"
#: The folder verify owns for the resume point: the state and the loader positions.
RESUME_DIR_VAR = "ACCEL_VERIFY_RESUME_DIR"
#: The resumed run: who loads the state, ``recorder`` (the script needs no change) or ``script``.
RESUME_VAR = "ACCEL_VERIFY_RESUME"
RESUME_MODES = ("recorder", "script")

RECORD_FORMAT = 1


def recorder_from_environment(accelerator: Any, environ: Any = None) -> VerifyRecorder | None:
    """The recorder `accel verify` asked for in the environment, or ``None`` when it did not ask.

    Raises:
        ValueError: ``ACCEL_VERIFY_STEPS`` is not a whole number of at least 1; ``ACCEL_VERIFY_SAVE_AT``
            is not a step before the last; a resume variable without ``ACCEL_VERIFY_RESUME_DIR``, or an
            unknown ``ACCEL_VERIFY_RESUME``.
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
    resume_dir = env.get(RESUME_DIR_VAR) or None
    save_at = _save_at(env.get(SAVE_AT_VAR), steps)
    resume = env.get(RESUME_VAR) or None
    if resume is not None and resume not in RESUME_MODES:
        raise ValueError(f"{RESUME_VAR}={resume!r}: expected one of {', '.join(RESUME_MODES)}")
    if (save_at is not None or resume is not None) and resume_dir is None:
        given = SAVE_AT_VAR if save_at is not None else RESUME_VAR
        raise ValueError(f"{given} is set but {RESUME_DIR_VAR} is not: it names the folder of the resume point")
    return VerifyRecorder(accelerator, path, steps, save_at=save_at, resume_dir=resume_dir, resume=resume)


def _save_at(raw: str | None, steps: int) -> int | None:
    """``ACCEL_VERIFY_SAVE_AT`` as a step number in ``1 .. steps - 1`` (``None`` when unset)."""
    if not raw:
        return None
    try:
        step = int(raw)
    except ValueError:
        step = 0
    if not 1 <= step < steps:
        raise ValueError(
            f"{SAVE_AT_VAR}={raw!r}: the step to save after must be a whole number from 1 to {steps - 1} "
            f"(before the last of the {steps} steps recorded)"
        )
    return step


class VerifyRecorder:
    """Keeps the per-step quantities of one run and writes them for `accel verify`.

    Args:
        accelerator: the Accelerator of the run (its strategy gives norms and gathered weights).
        path: where the main process writes the JSON record.
        steps: the optimizer step after which the run ends (a resumed run records only the steps after
            its resume point).
        save_at: save the state after this optimizer step (``accel verify --resume-at``), or ``None``.
        resume_dir: the folder of the resume point (the state and the loader positions).
        resume: resume from ``resume_dir``: ``"recorder"`` (load it here), ``"script"`` (the script
            loads it), or ``None`` (do not resume).
    """

    def __init__(
        self,
        accelerator: Any,
        path: str,
        steps: int,
        *,
        save_at: int | None = None,
        resume_dir: str | None = None,
        resume: str | None = None,
    ) -> None:
        self.accelerator = accelerator
        self.path = path
        self.steps = steps
        self.save_at = save_at
        self.resume_dir = resume_dir
        self.resume = resume
        self.backward_calls = 0
        self.records: list[dict[str, Any]] = []
        self._losses: list[float] = []
        self._pending: dict[str, Any] = {}
        self._lr: float | None = None
        self._optimizer: Any = None
        self._save_pending: dict[str, Any] | None = None  # set after step save_at, until the state is saved
        self.loaded = False  # a resumed run: load_state has run (the recorder's or the script's)
        self.point: Any = None
        if resume is not None:
            from accel_train.verify_resume import ResumePoint

            self.point = ResumePoint.read(str(resume_dir))
        #: The number of the first step this run records (after the resume point when resuming).
        self.first_step = 1 if self.point is None else self.point.step + 1
        #: False once the run steps an optimizer it never passed to ``prepare`` (followed instead, see below).
        self.optimizer_prepared: bool | None = None
        self._unprepared_hooks: list[Any] | None = None
        self._write(complete=False)

    # -- hooks ----------------------------------------------------------------------------------------

    def attach(self, optimizer: Any) -> None:
        """Follow ``optimizer``'s steps (the first prepared optimizer only: its steps are the ones counted)."""
        if self._optimizer is None:
            self._stop_following_unprepared_optimizers()
            self._optimizer = optimizer
            self.optimizer_prepared = True
            optimizer._verify_hook = self

    def _follow_unprepared_optimizers(self) -> None:
        """Count the steps of an optimizer the script never passed to ``prepare`` (from its first ``backward``
        with no prepared optimizer, until one is prepared or the run ends).

        Such a script trains under DDP (whose model keeps its parameters) but not under FSDP, DeepSpeed or
        tensor parallelism, whose prepared model has new parameters the optimizer does not hold: following it
        lets the comparison show where the runs part (and the record says the optimizer was not prepared),
        instead of a run that recorded no step. torch's global optimizer hooks see every optimizer's step.
        """
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        def before(optimizer: Any, args: Any, kwargs: Any) -> None:
            self.optimizer_prepared = False
            if optimizer.param_groups:
                self._lr = _number(optimizer.param_groups[0].get("lr"))
            self.before_step(optimizer)

        def after(optimizer: Any, args: Any, kwargs: Any) -> None:
            self.after_step(optimizer)

        self._unprepared_hooks = [register_optimizer_step_pre_hook(before), register_optimizer_step_post_hook(after)]

    def _stop_following_unprepared_optimizers(self) -> None:
        for handle in self._unprepared_hooks or ():
            handle.remove()
        self._unprepared_hooks = None

    def after_prepare(self) -> None:
        """Objects were prepared: a run resumed by the recorder loads the state once the script has prepared
        as many of each kind as the saving run had (``load_state`` needs the same numbers)."""
        if self.resume != "recorder" or self.loaded or self.backward_calls:
            return
        from accel_train.verify_resume import load_with_positions, prepared_counts

        if prepared_counts(self.accelerator) != self.point.counts:
            return
        load_with_positions(self.accelerator, self.point.checkpoint, str(self.resume_dir))
        self.loaded = True

    def on_load_state(self) -> None:
        """``load_state`` ran (the script's own resume, or the recorder's)."""
        self.loaded = True

    def on_zero_grad(self) -> None:
        """The script zeroes the gradients: after step ``save_at`` (its scheduler has stepped), save now."""
        if self._save_pending is not None:
            self._save_state()

    def on_backward(self, loss: torch.Tensor) -> None:
        """Note the loss given to ``accelerator.backward`` (before the division by the accumulation steps).

        Raises:
            RuntimeError: a resumed run reaches its first ``backward`` without having loaded the state.
        """
        if self._save_pending is not None:  # the script never zeroed the gradients through the optimizer
            self._save_state()
        if self.resume is not None and not self.loaded and self.backward_calls == 0:
            raise RuntimeError(self._not_resumed())
        self.backward_calls += 1
        if self._optimizer is None and self._unprepared_hooks is None:
            self._follow_unprepared_optimizers()
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
        step = self.first_step + len(self.records)
        self.records.append({"step": step, "loss": loss, **self._pending})
        self._pending = {}
        if step == self.save_at:
            self._note_save_point()
        if step < self.steps:
            self._write(complete=False)
            return
        self._finish()

    # -- internals ------------------------------------------------------------------------------------

    def _note_save_point(self) -> None:
        """The end of step ``save_at``: keep each loader's position; the state is saved at the next
        ``zero_grad`` (or ``backward``), once the script has stepped its scheduler."""
        from accel_train.verify_resume import prepared_counts, save_loader_positions

        os.makedirs(str(self.resume_dir), exist_ok=True)
        positions = save_loader_positions(self.accelerator, str(self.resume_dir))
        self._save_pending = {"counts": prepared_counts(self.accelerator), "positions": positions}

    def _save_state(self) -> None:
        """Save the state into the resume folder and describe the resume point there."""
        from accel_train.verify_resume import ResumePoint

        pending, self._save_pending = self._save_pending, None
        assert pending is not None
        accelerator = self.accelerator
        # A loader that yielded a batch since the end of the step (a script that zeroes the gradients at
        # the start of its loop body) is saved where it stood then: the resumed run reads that batch again.
        moved = any(
            state is not None and loader.state_dict().get("batches_yielded") != state.get("batches_yielded")
            for loader, state in zip(accelerator._dataloaders, pending["positions"])
        )
        previous = accelerator._rewind_active_loader
        accelerator._rewind_active_loader = previous or moved
        # into verify's folder, not the project's numbered checkpoints (which automatic naming would pick),
        # and written before the run goes on (the resumed launch reads it once this one has ended)
        config = accelerator.project_configuration
        automatic, config.automatic_checkpoint_naming = config.automatic_checkpoint_naming, False
        try:
            folder = accelerator.save_state(os.path.join(str(self.resume_dir), "state"), async_save=False)
        finally:
            accelerator._rewind_active_loader = previous
            config.automatic_checkpoint_naming = automatic
        if accelerator.is_main_process:
            ResumePoint(int(self.save_at or 0), str(folder), pending["counts"]).write(str(self.resume_dir))
        accelerator.wait_for_everyone()

    def _not_resumed(self) -> str:
        """The error of a resumed run whose first ``backward`` comes before any ``load_state``."""
        from accel_train.verify_resume import prepared_counts

        if self.resume == "script":
            return (
                "accel verify --resume-at: the resumed run reached its first accelerator.backward without "
                f"calling accelerator.load_state: the script arguments given by --resume-args must make it load "
                f"{self.point.checkpoint}"
            )
        return (
            "accel verify --resume-at: the resumed run reached its first accelerator.backward before it had "
            "prepared what the saving run had when it saved, so the state could not be loaded ("
            f"{self.point.describe_difference(prepared_counts(self.accelerator))}); prepare every model, "
            "optimizer, scheduler and data loader before the training loop, or resume in the script "
            "(--resume-args)"
        )

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
        self._stop_following_unprepared_optimizers()
        accelerator = self.accelerator
        weights: dict[str, torch.Tensor] = {}
        models = list(accelerator._models)
        for index, model in enumerate(models):
            prefix = "" if len(models) == 1 else f"model{index}."
            for name, value in self._full_state_dict(model).items():
                if isinstance(value, torch.Tensor):
                    weights[prefix + name] = value.detach().to("cpu", torch.float32).contiguous()
        if accelerator.is_main_process:
            from accel_train.checkpoint.file_io import save_torch

            save_torch(weights, self.path + ".params.pt")
        self._write(complete=True)
        accelerator.wait_for_everyone()
        raise SystemExit(0)

    def _full_state_dict(self, model: Any) -> dict[str, Any]:
        """The whole state dict of ``model`` on every process. Under ZeRO-3 it is gathered here whatever the
        16-bit export setting (``get_state_dict`` refuses without it, and the run must not need it)."""
        accelerator = self.accelerator
        if accelerator.distributed_type.name == "DEEPSPEED":
            engine = accelerator._strategy._engine_of(model)
            if engine is not None and engine.zero_optimization_stage() >= 3:
                from accel_train.strategies.deepspeed.zero3_state import gather_zero3_state_dict

                return gather_zero3_state_dict(engine.module)
        return accelerator.get_state_dict(model)

    def _write(self, complete: bool) -> None:
        if not self.accelerator.is_main_process:
            return
        record = {
            "format": RECORD_FORMAT,
            "complete": complete,
            "steps_requested": self.steps,
            "first_step": self.first_step,
            "save_at": self.save_at,
            "resumed_by": self.resume,
            "backward_calls": self.backward_calls,
            "num_processes": self.accelerator.num_processes,
            "data_parallel_size": _data_parallel_size(self.accelerator),
            "distributed_type": self.accelerator.distributed_type.name,
            "mixed_precision": str(self.accelerator.mixed_precision),
            "optimizer_prepared": self.optimizer_prepared,
            "steps": self.records,
            "params_file": os.path.basename(self.path) + ".params.pt" if complete else None,
        }
        partial = self.path + ".partial"
        with open(partial, "w", encoding="utf-8") as handle:
            json.dump(record, handle, indent=1)
        os.replace(partial, self.path)


def _data_parallel_size(accelerator: Any) -> int:
    """How many processes read different batches (``dp_replicate`` x ``dp_shard`` x ``ep``): tensor, context
    and pipeline peers read the same ones, so the reference runs that many processes, not the world size."""
    dims = getattr(getattr(accelerator, "_strategy", None), "parallel_dims", None)
    size = getattr(dims, "data_parallel_size", None)
    return int(size) if isinstance(size, int) else int(accelerator.num_processes)


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
