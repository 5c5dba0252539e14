"""Nothing ``load_state`` reads may run code, on every backend (the backend table in ``cpu_backends``).

For each backend, 2 real gloo processes save a checkpoint; then each file of it in turn is replaced by a
``torch.save`` zip whose pickle would write a marker file when unpickled, and both processes call
``load_state``. Every replaced file that the backend reads is refused by name (its path in the error, the
same error on both processes), the model is left as it was, and the marker never appears. A backend added
to the table gets this test with nothing to write.
"""

from __future__ import annotations

import os
import shutil

import pytest
import torch
from cpu_backends import BACKENDS_BY_NAME, CPU_BACKENDS
from fsdp_helpers import crafted_torch_file

from accel_state.testing import reset_shared_state

pytestmark = pytest.mark.slow

#: Files a backend writes into its checkpoint that ``load_state`` never opens: DeepSpeed's scripts for other
#: tools, and the marker that says which engine folder holds an optimizer (the engine reads its own files).
NOT_READ = {"zero_to_fp32.py", "zero_to_torch.py", "deepspeed_optimizer.json"}


@pytest.fixture
def pool(pools):
    """The session's pool of two processes (``pools(2)``, shared with the other multi-rank tests)."""
    return pools(2)


def _files(folder: str) -> list[str]:
    found = []
    for root, _, names in os.walk(folder):
        found.extend(os.path.relpath(os.path.join(root, name), folder) for name in names)
    return sorted(found)


def rank_plant_each_file(backend: str, base: str, marker: str) -> list[dict]:
    """Save, then for each file of the checkpoint: replace it with a crafted pickle, load, put it back."""
    reset_shared_state()
    spec = BACKENDS_BY_NAME[backend]
    accelerator = spec.accelerator(base)
    model, optimizer = spec.prepare(accelerator)
    spec.step(accelerator, model, optimizer, 0)
    folder = accelerator.save_state(os.path.join(base, "ckpt"))
    spec.step(accelerator, model, optimizer, 1)  # the model now differs from the checkpoint
    crafted = crafted_torch_file(marker)
    files = _files(folder)
    accelerator.wait_for_everyone()  # every process listed the folder before the first file changes
    results = []
    for relative in files:
        path = os.path.join(folder, relative)
        if accelerator.is_main_process:
            shutil.copy2(path, f"{path}.kept")
            with open(path, "wb") as handle:
                handle.write(crafted)
        accelerator.wait_for_everyone()
        before = spec.state(accelerator, model)
        error = ""
        try:
            accelerator.load_state(folder)
        except Exception as raised:
            error = f"{type(raised).__name__}: {raised}"
        accelerator.wait_for_everyone()
        unchanged = all(torch.equal(value, before[key]) for key, value in spec.state(accelerator, model).items())
        if accelerator.is_main_process:
            os.replace(f"{path}.kept", path)
        accelerator.wait_for_everyone()
        results.append({"file": relative, "error": error, "unchanged": unchanged, "ran": os.path.exists(marker)})
        if not error:  # a file that is not read: the checkpoint loaded; move the model away from it again
            spec.step(accelerator, model, optimizer, 1 + len(results))
    accelerator.load_state(folder)  # every file back: the checkpoint loads as saved
    reset_shared_state()
    return results


@pytest.mark.parametrize("backend", [backend.name for backend in CPU_BACKENDS])
def test_a_pickle_planted_in_any_checkpoint_file_never_runs(pool, tmp_path, backend: str) -> None:
    missing = BACKENDS_BY_NAME[backend].requires()
    if missing:
        pytest.skip(missing)
    marker = str(tmp_path / "marker")
    on_rank = pool.run(rank_plant_each_file, backend, str(tmp_path), marker, timeout=120)
    assert on_rank[0], "the checkpoint holds no file"
    refused = []
    for first, second in zip(*on_rank):
        case = f"{backend}: {first['file']}"
        assert not first["ran"] and not second["ran"], f"{case}: the planted pickle ran"
        if os.path.basename(first["file"]) in NOT_READ:
            continue
        for result in (first, second):
            assert result["error"], f"{case}: loaded without a word"
            assert result["error"].startswith(("UnsafeCheckpointError", "CorruptCheckpointError")), (case, result)
            assert os.path.basename(first["file"]) in result["error"], (case, result["error"])
            assert result["unchanged"], f"{case}: the model changed before the refusal: {result['error']}"
        assert first["error"] == second["error"], (case, first["error"], second["error"])
        refused.append(first["file"])
    assert refused, f"{backend}: no file was refused"
    assert not os.path.exists(marker)
