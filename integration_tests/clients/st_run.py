"""sentence-transformers' SentenceTransformerTrainer on a tiny BERT built from a config (written to a
local folder first, nothing downloaded), with a contrastive loss (MultipleNegativesRankingLoss).

Runs on accel through the ``accelerate`` alias and unchanged on the documented system (reference
figures); 1 process with python, 2 with a launcher.

    st_run.py OUT full      6 steps, then an evaluation; figures in OUT/full.json
"""

from __future__ import annotations

import os
import sys

import tiny
from datasets import Dataset


def base_model(folder: str) -> str:
    """A 2-layer BERT with random weights (seed 0) and its tokenizer, saved in ``folder``."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    tokens = tiny.tokenizer(bert=True)
    config = BertConfig(
        vocab_size=len(tokens),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
        pad_token_id=0,
    )
    BertModel(config).save_pretrained(folder)
    tokens.save_pretrained(folder)
    return folder


def main() -> None:
    out, mode = sys.argv[1], sys.argv[2]
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
        losses,
    )
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    rank = int(os.environ.get("RANK", "0"))
    folder = os.path.join(out, f"base-{rank}")  # each process writes its own copy (same seed, same weights)
    encoder = Transformer(base_model(folder), max_seq_length=16)
    model = SentenceTransformer(modules=[encoder, Pooling(encoder.get_embedding_dimension(), "mean")], device="cpu")
    train = Dataset.from_dict({"anchor": tiny.sentences(48, seed=6), "positive": tiny.sentences(48, seed=7)})
    evaluation = Dataset.from_dict({"anchor": tiny.sentences(16, seed=8), "positive": tiny.sentences(16, seed=9)})
    args = SentenceTransformerTrainingArguments(
        output_dir=os.path.join(out, "run"),
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        max_steps=6,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        data_seed=0,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = SentenceTransformerTrainer(
        model=model,
        args=args,
        train_dataset=train,
        eval_dataset=evaluation,
        loss=losses.MultipleNegativesRankingLoss(model),
    )
    result = trainer.train()
    metrics = trainer.evaluate()
    if trainer.is_world_process_zero():
        tiny.write(
            os.path.join(out, f"{mode}.json"),
            {
                "losses": [entry["loss"] for entry in trainer.state.log_history if "loss" in entry],
                "eval_loss": metrics["eval_loss"],
                "world": trainer.args.world_size,
                "steps": trainer.state.global_step,
                "steps_per_second": result.metrics.get("train_steps_per_second"),
                "params": tiny.digest(model),
            },
        )


if __name__ == "__main__":
    main()
