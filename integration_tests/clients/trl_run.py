"""TRL's SFTTrainer and DPOTrainer on a tiny Llama built from a config (no download).

Runs on accel through the ``accelerate`` alias (ACCEL_PROVIDE_ACCELERATE=1), and unchanged on the
documented system to record the reference figures (tools/record_client_reference.py); 1 process with
python, 2 with ``accel launch --cpu --num_processes 2`` (or ``accelerate launch``).

    trl_run.py OUT sft-full     6 optimizer steps (accumulation 2), evaluation, figures in OUT/sft-full.json
    trl_run.py OUT sft-stop     the same run stopped after step 3 (checkpoint-3 written)
    trl_run.py OUT sft-resume   resumed from OUT/checkpoint-3 up to step 6, figures in OUT/sft-resume.json
    trl_run.py OUT dpo          3 DPO steps against a frozen reference model, figures in OUT/dpo.json

Figures include steps/s and CPU seconds per step of training (this process), which the test does not
compare (tools/bench/clients.py does); CLIENT_MAX_STEPS sets the DPO run's steps for that benchmark.
"""

from __future__ import annotations

import os
import sys
import time

import tiny
from datasets import Dataset
from transformers import TrainerCallback


class StopAfterStep3(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        if state.global_step == 3:
            control.should_training_stop = True
        return control


class Perturb(TrainerCallback):
    """``CLIENT_PERTURB=lr-step``: one more learning-rate scheduler step after optimizer step 4, once the
    checkpoint of step 3 is written (a perturbed run leaves it as the unperturbed run does: the test resumes
    trl-sft-1-resume from it)."""

    def on_step_end(self, args, state, control, lr_scheduler=None, **kwargs):  # type: ignore[no-untyped-def]
        if state.global_step == 4 and tiny.perturbation() == "lr-step":
            lr_scheduler.step()
        return control


def timed_train(trainer, **kwargs):  # type: ignore[no-untyped-def]
    """``trainer.train(**kwargs)``, its CPU seconds (this process) kept for the figures."""
    started = time.process_time()
    result = trainer.train(**kwargs)
    result.metrics["cpu_seconds"] = time.process_time() - started
    return result


def figures(trainer, train_metrics: dict, eval_metrics: dict | None) -> dict:  # type: ignore[no-untyped-def]
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    extra = {}
    for key in ("rewards/chosen", "rewards/rejected", "rewards/margins"):
        values = [entry[key] for entry in trainer.state.log_history if key in entry]
        if values:
            extra[key] = values
    return {
        "losses": losses,
        "eval_loss": None if eval_metrics is None else eval_metrics["eval_loss"],
        "world": trainer.args.world_size,
        "steps": trainer.state.global_step,
        "steps_per_second": train_metrics.get("train_steps_per_second"),
        "cpu_seconds_per_step": train_metrics["cpu_seconds"] / max(trainer.state.global_step, 1),
        "params": tiny.digest(trainer.model),
        **extra,
    }


def sft(out: str, mode: str) -> None:
    from trl import SFTConfig, SFTTrainer

    args = SFTConfig(
        output_dir=out,
        per_device_train_batch_size=2,
        per_device_eval_batch_size=2,
        gradient_accumulation_steps=2,
        max_steps=6,
        learning_rate=1e-2,
        save_strategy="steps",
        save_steps=3,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        seed=0,
        data_seed=0,
        dataloader_num_workers=0,
        disable_tqdm=True,
        max_length=16,
        packing=False,
        bf16=False,
    )
    trainer = SFTTrainer(
        model=tiny.causal_lm(),
        args=args,
        processing_class=tiny.tokenizer(),
        train_dataset=Dataset.from_dict({"text": tiny.sentences(48, seed=1)}),
        # 5 samples, 2 per process: the last evaluation batch is short (one sample on one process)
        eval_dataset=Dataset.from_dict({"text": tiny.sentences(5, seed=2)}),
        callbacks=[StopAfterStep3(), Perturb()] if mode == "sft-stop" else [Perturb()],
    )
    resume = os.path.join(out, "checkpoint-3") if mode == "sft-resume" else None
    result = timed_train(trainer, resume_from_checkpoint=resume)
    if mode == "sft-stop":
        return
    evaluation = trainer.evaluate()
    if trainer.is_world_process_zero():
        tiny.write(os.path.join(out, f"{mode}.json"), figures(trainer, result.metrics, evaluation))


def dpo(out: str) -> None:
    from trl import DPOConfig, DPOTrainer

    prompts = tiny.sentences(16, seed=3, length=(2, 4))
    chosen = tiny.sentences(16, seed=4, length=(2, 5))
    rejected = tiny.sentences(16, seed=5, length=(2, 5))
    args = DPOConfig(
        output_dir=out,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=1,
        max_steps=int(os.environ.get("CLIENT_MAX_STEPS", "3")),  # more for tools/bench/clients.py
        learning_rate=1e-2,
        beta=0.1,
        save_strategy="no",
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        seed=0,
        data_seed=0,
        dataloader_num_workers=0,
        disable_tqdm=True,
        max_length=24,
        bf16=False,
    )
    trainer = DPOTrainer(
        model=tiny.causal_lm(),
        ref_model=tiny.causal_lm(),
        args=args,
        processing_class=tiny.tokenizer(),
        train_dataset=Dataset.from_dict({"prompt": prompts, "chosen": chosen, "rejected": rejected}),
    )
    result = timed_train(trainer)
    if trainer.is_world_process_zero():
        tiny.write(os.path.join(out, "dpo.json"), figures(trainer, result.metrics, None))


def main() -> None:
    out, mode = sys.argv[1], sys.argv[2]
    if mode == "dpo":
        dpo(out)
    else:
        sft(out, mode)


if __name__ == "__main__":
    main()
