"""Loading validates every file before it changes any object (issue 36, point 6).

Each case rewrites one file of a real one-process ``save_state`` checkpoint into a well-formed file whose
content does not fit this run (a torch generator state of the wrong length, a Python generator state with
too few words, a weight of another shape). ``load_state`` must refuse it by name before the model, the
optimizer or any generator changed.
"""

from __future__ import annotations

import json
import os
import random

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from accel_state.errors import CorruptCheckpointError


def _rewrite(path: str, change) -> None:  # type: ignore[no-untyped-def]
    """Rewrite the safetensors file ``path`` as a well-formed file, its tensors and metadata passed through
    ``change(tensors, metadata)`` first."""
    with safe_open(path, framework="pt") as handle:
        metadata = dict(handle.metadata() or {})
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}
    change(tensors, metadata)
    save_file(tensors, path, metadata=metadata)


def _everything(model, optimizer) -> tuple:
    params = {name: value.detach().clone() for name, value in model.state_dict().items()}
    state = [
        {key: value.clone() if isinstance(value, torch.Tensor) else value for key, value in entry.items()}
        for entry in optimizer.optimizer.state.values()
    ]
    return params, state, torch.get_rng_state(), random.getstate()


def _assert_same(before: tuple, after: tuple) -> None:
    assert before[0].keys() == after[0].keys()
    for name, value in before[0].items():
        assert torch.equal(after[0][name], value), f"parameter {name} changed"
    assert len(before[1]) == len(after[1])
    for old, new in zip(before[1], after[1]):
        for key, value in old.items():
            assert torch.equal(torch.as_tensor(new[key]), torch.as_tensor(value)), f"optimizer state {key} changed"
    assert torch.equal(after[2], before[2]), "torch's generator changed"
    assert after[3] == before[3], "Python's generator changed"


def _short_torch_state(tensors, metadata) -> None:  # type: ignore[no-untyped-def]
    tensors["torch_manual_seed"] = tensors["torch_manual_seed"][:-16].clone()


def _short_python_state(tensors, metadata) -> None:  # type: ignore[no-untyped-def]
    version, words, gauss = json.loads(metadata["random_state"])
    metadata["random_state"] = json.dumps([version, words[:100], gauss])


def _wide_torch_state(tensors, metadata) -> None:  # type: ignore[no-untyped-def]
    tensors["torch_manual_seed"] = tensors["torch_manual_seed"].to(torch.int32)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (_short_torch_state, "torch_manual_seed"),
        (_wide_torch_state, "torch_manual_seed"),
        (_short_python_state, "random_state"),
    ],
)
def test_rng_state_that_does_not_fit_is_refused_before_anything_changes(saved, change, named: str) -> None:
    accelerator, model, optimizer, folder = saved
    path = os.path.join(folder, "random_states_0.safetensors")
    _rewrite(path, change)
    before = _everything(model, optimizer)
    with pytest.raises(CorruptCheckpointError) as info:
        accelerator.load_state(folder)
    assert info.value.path == path and named in str(info.value)
    _assert_same(before, _everything(model, optimizer))


def test_weight_of_another_shape_is_refused_before_any_parameter_changes(saved) -> None:
    from accel_train.checkpointing import CheckpointMismatchError

    accelerator, model, optimizer, folder = saved
    path = os.path.join(folder, "model.safetensors")
    # the first layer fits (torch would copy it), the last one does not
    _rewrite(path, lambda tensors, metadata: tensors.update({"2.weight": torch.zeros(3, 16)}))
    before = _everything(model, optimizer)
    with pytest.raises(CheckpointMismatchError, match=r"'2\.weight' of shape \(3, 16\).*\(2, 16\)"):
        accelerator.load_state(folder)
    _assert_same(before, _everything(model, optimizer))


def test_fitting_checkpoint_still_loads(saved) -> None:
    accelerator, model, _optimizer, folder = saved
    saved_weight = safe_open(os.path.join(folder, "model.safetensors"), framework="pt").get_tensor("0.weight")
    accelerator.load_state(folder)
    assert torch.equal(model.state_dict()["0.weight"], saved_weight)


# -- symbolic links: every file a load reads resolves inside the checkpoint ------------------------------


def _link_out(path: str, outside: str) -> None:
    """Move ``path`` to ``outside`` and leave a symbolic link to it in its place."""
    os.makedirs(os.path.dirname(outside), exist_ok=True)
    os.replace(path, outside)
    os.symlink(outside, path)


@pytest.mark.parametrize("name", ["optimizer.bin", "model.safetensors", "random_states_0.safetensors"])
def test_file_linked_outside_the_checkpoint_is_refused(saved, tmp_path, name: str) -> None:
    from accel_state.errors import UnsafeCheckpointError

    accelerator, model, optimizer, folder = saved
    path = os.path.join(folder, name)
    outside = str(tmp_path / "elsewhere" / name)
    _link_out(path, outside)
    before = _everything(model, optimizer)
    with pytest.raises(UnsafeCheckpointError) as info:
        accelerator.load_state(folder)
    assert info.value.path == path and f"{path!r} -> {outside!r}" in info.value.found
    _assert_same(before, _everything(model, optimizer))


def test_sharded_folder_linked_outside_the_checkpoint_is_refused(saved, tmp_path) -> None:
    """A read sub-folder (here a DCP folder of the layout) that is itself a link out of the checkpoint."""
    import torch.distributed.checkpoint as dcp

    from accel_state.errors import UnsafeCheckpointError
    from accel_train.checkpoint.file_io import CheckpointIO
    from accel_train.checkpointing import check_folder

    _, _, _, folder = saved
    outside = str(tmp_path / "elsewhere" / "pytorch_model_fsdp_0")
    dcp.save({"model": {"w": torch.ones(2)}}, checkpoint_id=outside, no_dist=True)
    link = os.path.join(folder, "pytorch_model_fsdp_0")
    os.symlink(outside, link)
    with pytest.raises(UnsafeCheckpointError) as info:
        check_folder(folder, CheckpointIO())
    assert info.value.path == link and outside in info.value.found


def test_file_linked_inside_the_checkpoint_loads(saved) -> None:
    accelerator, model, optimizer, folder = saved
    os.makedirs(os.path.join(folder, "kept"))
    os.replace(os.path.join(folder, "optimizer.bin"), os.path.join(folder, "kept", "optimizer.bin"))
    os.symlink(os.path.join("kept", "optimizer.bin"), os.path.join(folder, "optimizer.bin"))  # a relative link
    saved_weight = safe_open(os.path.join(folder, "model.safetensors"), framework="pt").get_tensor("0.weight")
    accelerator.load_state(folder)
    assert torch.equal(model.state_dict()["0.weight"], saved_weight)
    assert optimizer.optimizer.state  # the optimizer state came back through the link
