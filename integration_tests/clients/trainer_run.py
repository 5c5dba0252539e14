"""A tiny randomly initialised causal LM trained with transformers' Trainer on accel (through the
``accelerate`` alias, ACCEL_PROVIDE_ACCELERATE=1). Run by test_transformers_peft.py, on 1 process with
python and on 2 with ``accel launch --cpu --num_processes 2``.

    trainer_run.py OUT full            train 8 steps (checkpoints at steps 4 and 8), save final weights
                                       and the eval loss
    trainer_run.py OUT resume          resume from OUT/checkpoint-4 up to step 8, save final weights

Beside the Trainer's eval loss, OUT/metrics-MODE.json holds the loss computed by hand from the final
weights (a fresh model and a plain loop, no Trainer) and which library ``import accelerate`` gave this
process. Both are worked out here, in the process that trained, rather than by the test: a separate
process to ask about ``accelerate`` and transformers imported into the test's own process cost about
20 CPU-s per case on a 2-core machine (issue 34, CI time).
"""

from __future__ import annotations

import json
import os
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

VOCAB, SEQ = 64, 12


def model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(config)


class Tokens(torch.utils.data.Dataset):
    def __init__(self, count: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, VOCAB, (count, SEQ), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "labels": self.ids[index].clone()}


def arguments(out: str, max_steps: int) -> TrainingArguments:
    return TrainingArguments(
        output_dir=out,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        max_steps=max_steps,
        learning_rate=1e-2,
        save_strategy="steps",
        save_steps=4,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        seed=0,
        data_seed=0,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )


def hand_eval_loss(weights: dict[str, torch.Tensor], world: int) -> float:
    """The mean loss over the 10 evaluation samples of a fresh model holding ``weights``, computed without
    the Trainer: the global batches each process evaluates are 4 samples per process; on 2 processes the
    last global batch is made even with the first samples again, and only its 2 real samples count."""
    net = model().eval()
    net.load_state_dict(weights)
    data = Tokens(10, seed=2)
    batches = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]] if world == 1 else [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 1]]
    counted = [4, 4, 2]
    total = 0.0
    with torch.no_grad():
        for indices, count in zip(batches, counted):
            ids = torch.stack([data[i]["input_ids"] for i in indices])
            total += float(net(input_ids=ids, labels=ids).loss) * count
    return total / 10


def accelerate_facts() -> dict[str, object]:
    """Which library ``import accelerate`` gives this process: accel through the opt-in alias, its
    modules the same objects as accel's, its distribution version marked ``+accel.``."""
    import importlib.metadata

    import accelerate
    import accelerate.utils.modeling

    import accel
    import accel_bigmodel.modeling

    same = accelerate is accel and accelerate.utils.modeling is accel_bigmodel.modeling
    return {"accelerate_is_accel": same, "accelerate_version": importlib.metadata.version("accelerate")}


def main() -> None:
    out, mode = sys.argv[1], sys.argv[2]
    trainer = Trainer(
        model=model(),
        args=arguments(out, 8),
        train_dataset=Tokens(64, seed=1),
        eval_dataset=Tokens(10, seed=2),
    )
    if mode == "resume":
        trainer.train(resume_from_checkpoint=os.path.join(out, "checkpoint-4"))
    else:
        trainer.train()
    metrics = trainer.evaluate()
    if trainer.is_world_process_zero():
        weights = {k: v.detach().cpu() for k, v in trainer.model.state_dict().items()}
        torch.save(weights, os.path.join(out, f"final-{mode}.pt"))
        world = trainer.args.world_size
        facts = {"eval_loss": metrics["eval_loss"], "world": world, "hand_eval_loss": hand_eval_loss(weights, world)}
        with open(os.path.join(out, f"metrics-{mode}.json"), "w") as f:
            json.dump({**facts, **accelerate_facts()}, f)


if __name__ == "__main__":
    main()
