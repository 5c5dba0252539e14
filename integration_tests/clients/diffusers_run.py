"""A diffusers training loop in the style of its examples (train_unconditional.py): a tiny UNet2DModel
from a config, a DDPM noise scheduler, an EMA copy, save/load hooks that write with ``save_pretrained``,
automatic checkpoint names with a total limit, TensorBoard logging, bf16 autocast, accumulation 2.

Runs on accel through the ``accelerate`` alias and unchanged on the documented system (reference
figures); 1 process with python, 2 with a launcher.

    diffusers_run.py OUT full      8 optimizer steps (2 epochs), figures in OUT/full.json
    diffusers_run.py OUT stop      the same run, stopped after step 3 (mid-epoch; checkpoints at 1, 2, 3; no figures)
    diffusers_run.py OUT resume    load the last checkpoint, skip the seen batches by hand, go on to step 8

The modes ``main-full``, ``main-stop`` and ``main-resume`` save as diffusers' examples do: only the main
process calls ``save_state`` (into ``OUT/checkpoint-STEP``, no automatic naming) after removing the oldest
checkpoints by hand, and every process loads the last one (the pattern the 2-process case checks);
``main-stop`` writes its figures too.
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import time

import tiny
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration, set_seed
from diffusers import DDPMScheduler, UNet2DModel
from diffusers.optimization import get_scheduler
from diffusers.training_utils import EMAModel

ACCUMULATION, BATCH, TOTAL_LIMIT = 2, 2, 2
MAX_STEPS = int(os.environ.get("CLIENT_MAX_STEPS", "8"))  # more for tools/bench/clients.py


def unet() -> UNet2DModel:
    return UNet2DModel(
        sample_size=8,
        in_channels=3,
        out_channels=3,
        layers_per_block=1,
        block_out_channels=(8, 16),
        down_block_types=("DownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "UpBlock2D"),
        norm_num_groups=4,
    )


def save_on_main(accelerator: Accelerator, out: str, global_step: int) -> None:
    """The examples' checkpointing: on the main process only, the oldest removed by hand first."""
    if not accelerator.is_main_process:
        return
    kept = sorted((d for d in os.listdir(out) if d.startswith("checkpoint-")), key=lambda d: int(d.split("-")[1]))
    for old in kept[: max(len(kept) - TOTAL_LIMIT + 1, 0)]:
        shutil.rmtree(os.path.join(out, old))
    accelerator.save_state(os.path.join(out, f"checkpoint-{global_step}"))


def main() -> None:
    out, mode = sys.argv[1], sys.argv[2]
    main_only = mode.startswith("main-")
    mode = mode.removeprefix("main-")
    accelerator = Accelerator(
        gradient_accumulation_steps=ACCUMULATION,
        mixed_precision="bf16",
        log_with="tensorboard",
        project_config=ProjectConfiguration(
            project_dir=out,
            logging_dir=os.path.join(out, "logs"),
            automatic_checkpoint_naming=not main_only,
            total_limit=None if main_only else TOTAL_LIMIT,
        ),
    )
    set_seed(0)
    model = unet()
    ema = EMAModel(model.parameters(), decay=0.9, use_ema_warmup=True, model_cls=UNet2DModel, model_config=model.config)

    def save_hook(models, weights, output_dir):  # type: ignore[no-untyped-def]
        if accelerator.is_main_process:
            ema.save_pretrained(os.path.join(output_dir, "unet_ema"))
            for each in models:  # the prepared (wrapped) models: unwrap, as the examples do
                accelerator.unwrap_model(each).save_pretrained(os.path.join(output_dir, "unet"))
                weights.pop()

    def load_hook(models, input_dir):  # type: ignore[no-untyped-def]
        loaded = EMAModel.from_pretrained(os.path.join(input_dir, "unet_ema"), UNet2DModel)
        ema.load_state_dict(loaded.state_dict())
        del loaded
        for _ in range(len(models)):
            each = accelerator.unwrap_model(models.pop())
            loaded = UNet2DModel.from_pretrained(input_dir, subfolder="unet")
            each.register_to_config(**loaded.config)
            each.load_state_dict(loaded.state_dict())
            del loaded

    accelerator.register_save_state_pre_hook(save_hook)
    accelerator.register_load_state_pre_hook(load_hook)

    images = torch.randn(16 * accelerator.num_processes, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    loader = torch.utils.data.DataLoader(images, batch_size=BATCH, shuffle=True)
    noise_scheduler = DDPMScheduler(num_train_timesteps=50)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    lr_scheduler = get_scheduler("cosine", optimizer=optimizer, num_warmup_steps=2, num_training_steps=MAX_STEPS)
    model, optimizer, loader, lr_scheduler = accelerator.prepare(model, optimizer, loader, lr_scheduler)
    ema.to(accelerator.device)
    if accelerator.is_main_process:
        accelerator.init_trackers("train_unconditional")

    updates_per_epoch = math.ceil(len(loader) / ACCUMULATION)
    epochs = math.ceil(MAX_STEPS / updates_per_epoch)
    global_step = first_epoch = resume_step = 0
    if mode == "resume" and main_only:
        last = sorted((d for d in os.listdir(out) if d.startswith("checkpoint-")), key=lambda d: int(d.split("-")[1]))
        accelerator.load_state(os.path.join(out, last[-1]))
        global_step = int(last[-1].split("-")[1])
        first_epoch = global_step // updates_per_epoch
        resume_step = (global_step * ACCUMULATION) % (updates_per_epoch * ACCUMULATION)
    elif mode == "resume":
        checkpoints = os.path.join(out, "checkpoints")
        last = sorted(os.listdir(checkpoints), key=lambda name: int(name.split("_")[1]))[-1]
        accelerator.load_state(os.path.join(checkpoints, last))
        accelerator.project_configuration.iteration = int(last.split("_")[1]) + 1  # go on numbering, as documented
        global_step = accelerator.step // ACCUMULATION  # micro-steps done, restored by load_state
        first_epoch = global_step // updates_per_epoch
        resume_step = (global_step * ACCUMULATION) % (updates_per_epoch * ACCUMULATION)

    losses: list[float] = []
    started, cpu_started = time.perf_counter(), time.process_time()
    timed_steps = 0
    for epoch in range(first_epoch, epochs):
        model.train()
        for step, clean in enumerate(loader):
            if mode == "resume" and epoch == first_epoch and step < resume_step:
                continue  # the examples' way of skipping the batches seen before the checkpoint
            if epoch == 0 and step == 1 and tiny.perturbation() == "skip-batch":
                continue
            noise = torch.randn(clean.shape, device=clean.device)
            timesteps = torch.randint(
                0, noise_scheduler.config.num_train_timesteps, (clean.shape[0],), device=clean.device
            )
            noisy = noise_scheduler.add_noise(clean, noise, timesteps)
            with accelerator.accumulate(model):
                prediction = model(noisy, timesteps).sample
                loss = F.mse_loss(prediction.float(), noise)
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                if not (global_step == 2 and tiny.perturbation() == "ema-update"):
                    ema.step(model.parameters())
                global_step += 1
                timed_steps += 1
                losses.append(float(accelerator.gather(loss.detach()).mean()))
                accelerator.log({"loss": losses[-1], "lr": lr_scheduler.get_last_lr()[0]}, step=global_step)
                if main_only:
                    save_on_main(accelerator, out, global_step)
                else:
                    accelerator.save_state()
                if mode == "stop" and global_step == 3:
                    break
                if global_step >= MAX_STEPS:
                    break
        if (mode == "stop" and global_step == 3) or global_step >= MAX_STEPS:
            break
    elapsed, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    accelerator.wait_for_everyone()
    if accelerator.is_main_process and (mode != "stop" or main_only):
        unwrapped = accelerator.unwrap_model(model)
        ema_copy = unet()
        ema.copy_to(ema_copy.parameters())
        tiny.write(
            os.path.join(out, f"{sys.argv[2]}.json"),
            {
                "losses": losses,
                "world": accelerator.num_processes,
                "steps": global_step,
                "steps_per_second": timed_steps / elapsed,
                "cpu_seconds_per_step": cpu_seconds / max(timed_steps, 1),
                "params": tiny.digest(unwrapped),
                "ema": tiny.digest(ema_copy),
                "ema_updates": ema.optimization_step,  # exact: one per optimizer step (sync_gradients)
                "checkpoints": sorted(
                    d for d in os.listdir(os.path.join(out, "" if main_only else "checkpoints")) if "checkpoint" in d
                ),
                "event_files": len(
                    [n for _, _, files in os.walk(os.path.join(out, "logs")) for n in files if "tfevents" in n]
                ),
            },
        )
    accelerator.end_training()


if __name__ == "__main__":
    main()
