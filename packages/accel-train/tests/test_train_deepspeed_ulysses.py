"""DeepSpeed ALST/Ulysses sequence parallelism on two real processes: a stock transformers Llama (built
from a config, ``attn_implementation="sdpa"``) trained with ``ParallelismConfig(sp_size=2)`` gives, step
by step, the loss of the same model trained on the whole sequences without sequence parallelism.

On CPU (gloo) every part runs: the Ulysses attention wrapper and its all-to-alls, the data-loader adapter,
the engine's gradient reduction over the sequence-parallel group. What needs CUDA is the flash-attention
implementations (``flash_attention_2`` / ``_3`` and hub kernels) and NCCL; the GPU test below runs those on
two GPUs and skips elsewhere.

Each run registers Ulysses in transformers' process-wide attention table and builds DeepSpeed's
sequence-parallel groups (once per process), so this module has its own pool and runs one
sequence-parallel ``prepare`` per process.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from accel_state.imports import is_deepspeed_available
from accel_state.install_hints import install_hint
from accel_state.testing import DistributedPool, free_port, reset_shared_state

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers (nox -s clients)"),
    pytest.mark.skipif(
        not is_deepspeed_available(), reason=f"needs DeepSpeed: {install_hint('accel-train', 'deepspeed')}"
    ),
]

SAMPLES = 4
SEQ = 16
VOCAB = 64
CLIP = 1.0


def _tiny_llama(attn: str, dtype: torch.dtype = torch.float32):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        attn_implementation=attn,
    )
    return LlamaForCausalLM(config).to(dtype)


def _samples() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(0, VOCAB, (SAMPLES // 2, SEQ), generator=generator).repeat(2, 1)  # seen twice
    position_ids = torch.arange(SEQ).repeat(SAMPLES, 1)
    return input_ids, position_ids


def _collate(batch):
    input_ids, position_ids = batch[0]
    return {"input_ids": input_ids[None], "position_ids": position_ids[None], "labels": input_ids[None].clone()}


def _reference_losses(attn: str, device: str, dtype: torch.dtype) -> list[float]:
    """What sp_size=1 computes: the whole sequences, one sample per step, in the loader's order."""
    model = _tiny_llama(attn, dtype).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    input_ids, position_ids = _samples()
    losses = []
    for index in range(SAMPLES):
        out = model(
            input_ids=input_ids[index : index + 1].to(device),
            position_ids=position_ids[index : index + 1].to(device),
            labels=input_ids[index : index + 1].to(device),
        )
        losses.append(out.loss.item())
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)  # as the engine does (gradient_clipping)
        optimizer.step()
        optimizer.zero_grad()
    return losses


def rank_ulysses(attn: str = "sdpa", zero_stage: int = 1) -> dict:
    reset_shared_state()
    device = "cuda" if attn.startswith("flash") else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    reference = _reference_losses(attn, device, dtype)  # before Ulysses takes transformers' attention over

    import torch.distributed.nn.functional as dist_fn

    from accel_train import Accelerator, DeepSpeedPlugin, DeepSpeedSequenceParallelConfig, ParallelismConfig

    parallelism = ParallelismConfig(sp_size=2, sp_handler=DeepSpeedSequenceParallelConfig(sp_attn_implementation=attn))
    accelerator = Accelerator(
        cpu=device == "cpu",
        mixed_precision="bf16" if dtype == torch.bfloat16 else "no",
        deepspeed_plugin=DeepSpeedPlugin(zero_stage=zero_stage, gradient_clipping=CLIP),
        parallelism_config=parallelism,
    )
    model = _tiny_llama(attn)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*_samples()), batch_size=1, collate_fn=_collate)
    model, optimizer, adapted = accelerator.prepare(model, optimizer, loader)
    unwrapped = accelerator.unwrap_model(model)
    from deepspeed.utils import groups

    group = groups._get_sequence_parallel_group()
    losses, shard_lengths = [], []
    for batch in adapted:
        batch = {k: v.to(accelerator.device) if torch.is_tensor(v) else v for k, v in batch.items()}
        shift_labels = batch.pop("shift_labels")
        shard_lengths.append(int(batch["input_ids"].shape[1]))
        logits = model(**batch).logits
        loss = unwrapped.loss_function(
            logits=logits, labels=None, shift_labels=shift_labels, vocab_size=unwrapped.config.vocab_size
        )
        # the shards' mean losses, weighted by their counted tokens, make the whole sequence's mean loss
        counted = (shift_labels != -100).sum()
        per_rank = dist_fn.all_gather(loss, group=group)
        tokens = dist_fn.all_gather(counted, group=group)
        loss = sum(part * count for part, count in zip(per_rank, tokens)) / sum(tokens)
        losses.append(loss.item())
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    config = accelerator.state.deepspeed_plugin.deepspeed_config
    return {
        "reference": reference,
        "losses": losses,
        "shard_lengths": shard_lengths,
        "adapter": type(adapted).__name__,
        "batches": len(adapted),
        "same_adapter": accelerator.deepspeed_ulysses_dl_adapter(adapted, model) is adapted,
        "batch_sizes": [config["train_micro_batch_size_per_gpu"], config["train_batch_size"]],
        "sp_world": groups._get_sequence_parallel_world_size(),
    }


def _check(results: list[dict], atol: float) -> None:
    for rank, result in enumerate(results):
        assert result["adapter"] == "UlyssesSPDataLoaderAdapter", rank
        # each process holds 2 of the 4 samples; the adapter feeds all 4 to both, half a sequence each
        assert result["batches"] == SAMPLES and result["shard_lengths"] == [SEQ // 2] * SAMPLES, result
        assert result["same_adapter"]
        assert result["batch_sizes"] == [1, 1], "one data-parallel rank: sp_size takes both processes"
        assert result["sp_world"] == 2
        assert len(result["losses"]) == SAMPLES
        torch.testing.assert_close(torch.tensor(result["losses"]), torch.tensor(result["reference"]), atol=atol, rtol=0)
    assert results[0]["losses"] == results[1]["losses"], "both ranks aggregate the same loss"
    losses = results[0]["losses"]
    assert losses[2] < losses[0] and losses[3] < losses[1], f"a sample seen again has a lower loss: {losses}"


def test_ulysses_sp2_loss_equals_the_unsplit_run_on_cpu() -> None:
    with DistributedPool(world_size=2, timeout=600) as pool:
        results = pool.run(rank_ulysses, "sdpa", 1)
    # losses after three SGD steps too: the gradients reduced over the sequence group are the unsplit ones
    _check(results, atol=1e-4)


_GPU_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    sys.path.insert(0, sys.argv[1])
    from test_train_deepspeed_ulysses import rank_ulysses
    result = rank_ulysses(sys.argv[2], int(sys.argv[3]))
    if int(os.environ["RANK"]) == 0:
        print("RESULT " + json.dumps(result))
    else:
        print("RESULT1 " + json.dumps(result))
    """
)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs (Ulysses over NCCL, one GPU per rank)")
@pytest.mark.skipif(importlib.util.find_spec("flash_attn") is None, reason="needs flash-attn for flash_attention_2")
def test_ulysses_with_flash_attention_on_two_gpus(tmp_path) -> None:
    script = tmp_path / "ulysses_gpu.py"
    script.write_text(_GPU_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "PARALLELISM_CONFIG_"))}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            "--master_addr=127.0.0.1",
            f"--master_port={free_port()}",
            str(script),
            os.path.dirname(__file__),
            "flash_attention_2",
            "3",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = {
        line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in done.stdout.splitlines() if line.startswith("RESULT")
    }
    assert done.returncode == 0 and len(lines) == 2, done.stdout[-3000:] + done.stderr[-3000:]
    _check([json.loads(lines["RESULT"]), json.loads(lines["RESULT1"])], atol=5e-2)  # bf16 on GPU
