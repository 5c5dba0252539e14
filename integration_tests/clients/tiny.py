"""Small pieces the client scripts share: a word-level tokenizer built in memory, a tiny causal LM and a
tiny BERT from configs (nothing downloaded), deterministic text data, and the figures each run writes
(losses, a digest of the final parameters, steps per second) as one JSON file.

The same scripts run on accel (through the ``accelerate`` alias) and, to record the reference figures, on
the documented system (tools/record_client_reference.py), so nothing here names either.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from typing import Any

import torch

WORDS = [f"w{i}" for i in range(40)]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "<s>", "</s>"]


def tokenizer(bert: bool = False) -> Any:
    """A fast tokenizer over ``WORDS`` (whitespace split), built in memory.

    Args:
        bert: add ``[CLS] ... [SEP]`` around each text (as a BERT tokenizer does) instead of ``<s>``.

    Returns:
        A ``PreTrainedTokenizerFast`` with pad, eos, bos, cls, sep, mask and unk tokens.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate(SPECIAL + WORDS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if bert:
        core.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])]
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        bos_token="<s>",
        eos_token="</s>",
        model_max_length=32,
    )


def causal_lm() -> Any:
    """A 2-layer Llama with random weights (seed 0) over the tokenizer's vocabulary."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(SPECIAL) + len(WORDS),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=5,
        eos_token_id=6,
    )
    return LlamaForCausalLM(config)


def sentences(count: int, seed: int, length: tuple[int, int] = (3, 8)) -> list[str]:
    """``count`` random sentences of ``WORDS`` (same on every machine for the same seed)."""
    draw = random.Random(seed)
    return [" ".join(draw.choice(WORDS) for _ in range(draw.randint(*length))) for _ in range(count)]


def digest(module: torch.nn.Module) -> dict[str, Any]:
    """The final parameters as a sha256 of their float32 bytes, and per-tensor sums to compare with a tolerance."""
    state = {name: tensor.detach().float().cpu().contiguous() for name, tensor in module.state_dict().items()}
    sha = hashlib.sha256()
    sums = {}
    for name in sorted(state):
        sha.update(name.encode())
        sha.update(state[name].numpy().tobytes())
        sums[name] = [float(state[name].sum()), float(state[name].abs().sum())]
    return {"sha256": sha.hexdigest(), "sums": sums}


#: The deliberate changes of one training step that ``CLIENT_PERTURB`` may ask for.
PERTURBATIONS = ("lr-step", "skip-batch", "ema-update")


def perturbation() -> str | None:
    """The change of one training step asked for by ``CLIENT_PERTURB`` (None: the run as written).

    Only the test of the comparison sets it, to show that a real difference in training is caught:
    ``lr-step`` (one more learning-rate scheduler step after optimizer step 4), ``skip-batch`` (the
    second batch is not trained on), ``ema-update`` (the EMA update after step 2 is dropped).
    """
    value = os.environ.get("CLIENT_PERTURB") or None
    if value is not None and value not in PERTURBATIONS:
        raise ValueError(f"CLIENT_PERTURB={value!r}: expected one of {', '.join(PERTURBATIONS)}")
    return value


def write(path: str, figures: dict[str, Any]) -> None:
    """Write the run's figures as JSON (the caller writes on the main process only)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as handle:
        json.dump(figures, handle, indent=1, sort_keys=True)
