"""FSDP-QLoRA on two real gloo processes: a bitsandbytes 4-bit model stored as bf16
(``bnb_4bit_quant_storage=torch.bfloat16``), peft LoRA adapters, FSDP with bf16 mixed precision.

The 4-bit weights must stay packed (FSDP's float32 upcast skips them), the adapters train, the loss
matches the same model on one process, the adapters save through peft's ``save_pretrained`` and
``save_model``, and ``save_state``/``load_state`` resume exactly. FSDP 2 and FSDP 1 (``use_orig_params``)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from accel_state.testing import DistributedPool, reset_shared_state

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("bitsandbytes") is None or importlib.util.find_spec("peft") is None,
    reason="needs bitsandbytes and peft",
)

WIDTH = 16
STEPS = 8
GLOBAL_BATCH = 8
LORA_TARGETS = ["up", "down"]


def _import_peft():
    """peft imports ``accelerate``: serve it from accel (the opt-in alias) where it is not installed."""
    if importlib.util.find_spec("accelerate") is None:
        from accel.accelerate_alias import install

        install()
    import peft

    return peft


def _quantized_linear(source: torch.nn.Linear) -> torch.nn.Module:
    """``source`` as a bitsandbytes nf4 ``Linear4bit`` whose packed weight is stored as bf16."""
    import bitsandbytes as bnb

    layer = bnb.nn.Linear4bit(
        source.in_features,
        source.out_features,
        compute_dtype=torch.bfloat16,
        quant_type="nf4",
        quant_storage=torch.bfloat16,
    )
    layer.weight = bnb.nn.Params4bit(
        source.weight.data.clone(),
        requires_grad=False,
        quant_type="nf4",
        quant_storage=torch.bfloat16,
        module=layer,  # keeps the quant_state on the layer too, where FSDP-gathered weights find it
    )
    layer.bias = torch.nn.Parameter(source.bias.data.clone(), requires_grad=False)
    return layer.to("cpu")  # quantizes the weight


class QBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(WIDTH, 2 * WIDTH)
        self.down = torch.nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class QNet(torch.nn.Module):
    _no_split_modules = ["QBlock"]

    def __init__(self) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(4, WIDTH)
        self.blocks = torch.nn.ModuleList([QBlock() for _ in range(2)])
        self.head = torch.nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x).float()


def qlora_model() -> torch.nn.Module:
    """The same bf16 model, its block layers 4-bit, with bf16 LoRA adapters, on every process (seeded):
    the usual FSDP-QLoRA layout (one dtype, as FSDP1's flat parameters need)."""
    peft = _import_peft()
    torch.manual_seed(0)
    model = QNet().to(torch.bfloat16)
    for block in model.blocks:
        block.up = _quantized_linear(block.up)
        block.down = _quantized_linear(block.down)
    for param in model.parameters():
        param.requires_grad_(False)
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=LORA_TARGETS, init_lora_weights=False)
    return peft.get_peft_model(model, config, autocast_adapter_dtype=False)


def batches(seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(STEPS):
        x = torch.randn(GLOBAL_BATCH, 4, generator=generator)
        out.append((x, x.sum(dim=1, keepdim=True)))
    return out


def packed_weights(model: torch.nn.Module) -> dict[str, tuple[str, int, bool]]:
    """name -> (dtype, bytes of this process's share, has a quant_state) of every 4-bit weight."""
    out = {}
    for name, param in model.named_parameters():
        if "up.base_layer.weight" in name or "down.base_layer.weight" in name:
            local = param.to_local() if hasattr(param, "to_local") else param
            out[_plain(name)] = (str(param.dtype), local.numel() * local.element_size())
    return out


def _plain(name: str) -> str:
    """``name`` without FSDP1's wrapper prefixes."""
    return name.replace("_fsdp_wrapped_module.", "")


def lora_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    out = {}
    for name, param in model.named_parameters():
        if "lora_" in name:
            full = param.full_tensor() if hasattr(param, "full_tensor") else param
            out[_plain(name)] = full.detach().float().clone()
    return out


def rank_qlora(version: int, folder: str, save_at: int | None, load: bool) -> dict:
    """Train the QLoRA model under FSDP ``version``; stop after saving at ``save_at``, or resume there."""
    reset_shared_state()
    from accel_train import Accelerator, FullyShardedDataParallelPlugin

    kwargs: dict = {"fsdp_version": version}
    if version == 1:
        kwargs["use_orig_params"] = True  # frozen 4-bit weights and trained adapters in one flat parameter
    accelerator = Accelerator(mixed_precision="bf16", fsdp_plugin=FullyShardedDataParallelPlugin(**kwargs))
    model = qlora_model()
    before = {"packed": packed_weights(model), "lora": lora_weights(model)}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    rank, world = accelerator.process_index, accelerator.num_processes
    start = save_at if load else 0
    if load:
        accelerator.load_state(folder)
    losses = []
    for step, (x, y) in enumerate(batches()):
        if step < start:
            continue
        share = x.shape[0] // world
        x, y = x[rank * share : (rank + 1) * share], y[rank * share : (rank + 1) * share]
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(accelerator.reduce(loss.detach(), "mean")))
        if save_at is not None and not load and step + 1 == save_at:
            accelerator.save_state(folder)
            break
    packed = packed_weights(model)
    if version == 1:  # the original parameters are views of this process's shard: gather them to read
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        with FSDP.summon_full_params(model):
            lora = lora_weights(model)
    else:
        lora = lora_weights(model)
    if save_at is None:  # the adapters, as users save them: peft's save_pretrained, and save_model
        state = accelerator.get_state_dict(model)
        accelerator.unwrap_model(model).save_pretrained(
            f"{folder}_adapter", state_dict=state, is_main_process=accelerator.is_main_process
        )
        accelerator.save_model(model, f"{folder}_model")
    return {"before": before, "packed": packed, "lora": lora, "losses": losses}


def rank_one_process() -> list[float]:
    """The same model and batches on one process, no FSDP: bf16 autocast, the whole batch per step."""
    model = qlora_model()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.01)
    losses = []
    for x, y in batches():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss))
    return losses


@pytest.fixture(scope="module")
def qlora_pool() -> DistributedPool:
    """Its own two processes: peft needs the ``accelerate`` alias installed, which must not leak into the
    processes the other tests share."""
    with DistributedPool(world_size=2, timeout=300) as pool:
        yield pool


@pytest.mark.parametrize("version", [2, 1])
def test_qlora_trains_with_packed_4bit_weights_and_resumes(qlora_pool: DistributedPool, tmp_path, version) -> None:
    folder = str(tmp_path / "state")
    whole = qlora_pool.run(rank_qlora, version, folder, None, False)
    first, second = whole
    # the 4-bit weights stay packed: bf16 storage, the processes' shares adding up to the packed bytes
    assert len(first["before"]["packed"]) == 4
    for name, (dtype, size) in first["before"]["packed"].items():
        assert size == 2 * WIDTH * WIDTH // 2  # 4 bits for each of the 2*WIDTH*WIDTH weights
        assert first["packed"][name][0] == second["packed"][name][0] == dtype == "torch.bfloat16", name
        assert first["packed"][name][1] + second["packed"][name][1] == size, name
    # the adapters trained, the same on both processes
    for name, start in first["before"]["lora"].items():
        assert not torch.equal(start, first["lora"][name]), name
        assert torch.equal(first["lora"][name], second["lora"][name]), name
    assert first["losses"] == second["losses"] and len(first["losses"]) == 8
    from safetensors.torch import load_file

    adapter = load_file(f"{folder}_adapter/adapter_model.safetensors")
    assert len(adapter) == len(first["lora"]) == 8
    for name, value in adapter.items():  # peft drops the adapter name from its keys
        trained = first["lora"][name.replace(".weight", ".default.weight")]
        torch.testing.assert_close(value.float(), trained)
    whole_model = load_file(f"{folder}_model/model.safetensors")
    for name, value in first["lora"].items():
        torch.testing.assert_close(whole_model[name].float(), value)
    reference = qlora_pool.run(rank_one_process)[0]
    assert first["losses"] == pytest.approx(reference, rel=5e-2)
    # save after 4 steps, resume: the same last 4 losses and adapters as the run without a stop
    qlora_pool.run(rank_qlora, version, folder, 4, False)
    resumed = qlora_pool.run(rank_qlora, version, folder, 4, True)[0]
    assert resumed["losses"] == first["losses"][4:]
    for name, value in first["lora"].items():
        assert torch.equal(resumed["lora"][name], value), name
