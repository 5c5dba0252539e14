"""Regional compilation compiles each repeated block and, beside them, every other child with
parameters (an input layer, a ``head``), also under FSDP2 where modules keep their identity."""

from __future__ import annotations

import torch
from fsdp_helpers import BlockNet

from accel_train.wrappers import compile_regions, compile_regions_in_place, is_compiled


def _compiled_in_place(module: torch.nn.Module) -> bool:
    return getattr(module, "_compiled_call_impl", None) is not None


def test_compile_regions_compiles_blocks_and_other_children() -> None:
    torch.manual_seed(0)
    model = BlockNet()
    x = torch.randn(3, 4)
    expected = model(x)
    same = compile_regions(model, backend="eager")
    assert same is model
    assert all(is_compiled(block) for block in model.blocks)
    assert is_compiled(model.head) and is_compiled(model.inp)
    assert torch.allclose(model(x), expected)
    plain = torch.nn.Linear(2, 2)
    assert is_compiled(compile_regions(plain, backend="eager"))  # no repeated blocks: the whole model


def test_compile_regions_in_place_keeps_identities_and_compiles_the_head() -> None:
    model = BlockNet()
    head, blocks = model.head, list(model.blocks)
    assert compile_regions_in_place(model, backend="eager") is model
    assert model.head is head and list(model.blocks) == blocks
    assert _compiled_in_place(model.head) and _compiled_in_place(model.inp)
    assert all(_compiled_in_place(block) for block in model.blocks)
    assert not _compiled_in_place(model)


def test_fsdp2_regional_compilation_reaches_the_head() -> None:
    from accel_state.testing import reset_shared_state
    from accel_train import Accelerator, FullyShardedDataParallelPlugin
    from accel_train.plugins import TorchDynamoPlugin

    reset_shared_state()
    accelerator = Accelerator(
        cpu=True,
        fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2),
        dynamo_plugin=TorchDynamoPlugin(backend="eager", use_regional_compilation=True),
    )
    torch.manual_seed(0)
    model = accelerator.prepare(BlockNet())
    inner = model._orig_mod if is_compiled(model) else model
    head = inner.head
    assert is_compiled(head) or _compiled_in_place(head)
    assert all(is_compiled(b) or _compiled_in_place(b) for b in inner.blocks)
    out = model(torch.ones(2, 4))
    accelerator.backward(out.sum())
    reset_shared_state()
