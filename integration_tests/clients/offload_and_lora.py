"""transformers' from_pretrained(device_map="auto", max_memory=..., offload_folder=...) with part of the
model on disk, and a LoRA adapter trained with peft, on accel through the ``accelerate`` alias.

    offload_and_lora.py WORKDIR offload     prints JSON: devices used, max output difference
    offload_and_lora.py WORKDIR lora        prints JSON: loss before/after, base weights unchanged
    offload_and_lora.py WORKDIR offload lora    both, one line each, in one process (the tests' way:
                                                the client stack is imported once)
"""

from __future__ import annotations

import json
import os
import sys

import torch
from trainer_run import SEQ, VOCAB, Tokens, model


def offload(workdir: str) -> dict:
    os.chdir(workdir)
    from transformers import AutoModelForCausalLM

    reference = model().eval()
    reference.save_pretrained("tiny-llama")  # a relative folder, as users pass it
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = reference(ids).logits
    weights = sum(p.numel() * p.element_size() for p in reference.parameters())
    loaded = AutoModelForCausalLM.from_pretrained(
        "tiny-llama",
        device_map="auto",
        max_memory={"cpu": int(weights * 0.5)},  # half the weights fit: the rest goes to disk
        offload_folder="offload",
        dtype=torch.float32,
    )
    with torch.no_grad():
        got = loaded(ids).logits
    return {
        "devices": sorted({str(d) for d in loaded.hf_device_map.values()}),
        "max_difference": float((got - expected).abs().max()),
        "offload_files": sorted(os.listdir("offload")),
    }


def lora(workdir: str) -> dict:
    from peft import LoraConfig, get_peft_model
    from transformers import Trainer, TrainingArguments

    base = model()
    before = {k: v.clone() for k, v in base.state_dict().items()}
    peft_model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    data = Tokens(32, seed=5)
    args = TrainingArguments(
        output_dir=os.path.join(workdir, "lora"),
        per_device_train_batch_size=4,
        max_steps=12,
        learning_rate=5e-2,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    trainer = Trainer(model=peft_model, args=args, train_dataset=data, eval_dataset=data)
    loss_before = trainer.evaluate()["eval_loss"]
    trainer.train()
    loss_after = trainer.evaluate()["eval_loss"]
    merged = peft_model.base_model.model.state_dict()
    base_unchanged = all(
        torch.equal(
            before[name],
            merged[
                name.replace("q_proj.weight", "q_proj.base_layer.weight").replace(
                    "v_proj.weight", "v_proj.base_layer.weight"
                )
            ],
        )
        for name in before
    )
    trainable = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    return {
        "loss_before": loss_before,
        "loss_after": loss_after,
        "base_unchanged": base_unchanged,
        "trainable_are_lora": bool(trainable) and all("lora_" in n for n in trainable),
    }


if __name__ == "__main__":
    workdir, parts = sys.argv[1], sys.argv[2:]
    for what in parts:
        result = offload(workdir) if what == "offload" else lora(workdir)
        print(f"RESULT {what} " + json.dumps(result))
