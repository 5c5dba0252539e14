"""Importing accel-state does no work: no torch until needed, no optional integration, no process group."""

from __future__ import annotations

import json
import subprocess
import sys

OPTIONAL = [
    "numpy",
    "tqdm",
    "psutil",
    "yaml",
    "safetensors",
    "wandb",
    "tensorboard",
    "deepspeed",
    "transformers",
    "torchdata",
]


def _run(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_accel_state_imports_neither_torch_nor_optional_packages() -> None:
    result = _run(
        "import sys, json; import accel_state; from accel_state import env_vars, enums, constants, cluster;"
        f" print(json.dumps({{m: m in sys.modules for m in {['torch', *OPTIONAL]!r}}}))"
    )
    assert not any(result.values()), result


def test_touching_the_state_module_starts_no_process_group_and_adds_nothing_to_torch() -> None:
    result = _run(
        "import sys, json, os; os.environ.update(RANK='0', WORLD_SIZE='2', MASTER_ADDR='127.0.0.1', MASTER_PORT='1');"
        " import torch; before = set(sys.modules);"
        " import accel_state.state, accel_state.operations, accel_state.random, accel_state.logging; import torch.distributed as dist;"
        f" print(json.dumps({{'group': dist.is_initialized(), **{{m: m in set(sys.modules) - before for m in {OPTIONAL!r}}}}}))"
    )
    assert not any(result.values()), result


def test_lazy_exports_load_on_first_use_cache_and_name_unknown_attributes() -> None:
    import pytest

    import accel_state

    assert dir(accel_state) == sorted(accel_state.__all__)
    with pytest.raises(AttributeError, match="module 'accel_state' has no attribute 'no_such_name'"):
        _ = accel_state.no_such_name
    from accel_state.environment import str_to_bool

    assert accel_state.str_to_bool is str_to_bool
    assert vars(accel_state)["str_to_bool"] is str_to_bool  # cached: later lookups skip __getattr__
