"""What libraries written for the documented system import: the opt-in ``accelerate`` alias, the
FSDP/DeepSpeed placeholders, and the documented utility names and module paths."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import accel.utils
from accel import _exports


def _python(code: str, env: dict[str, str] | None = None, cwd: str | None = None) -> subprocess.CompletedProcess:
    full = {**os.environ, **(env or {})}
    full.pop("ACCEL_PROVIDE_ACCELERATE", None) if env is None else None
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=full, cwd=cwd, capture_output=True, text=True, check=False
    )


# -- the accelerate alias ---------------------------------------------------------------------------

ALIAS_CHECK = """
import importlib.metadata as m, sys
import accelerate, accel
from accelerate.utils.modeling import get_balanced_memory
from accelerate import Accelerator
import accel_bigmodel.planning, accel_train.accelerator
assert accelerate is accel
assert get_balanced_memory is accel_bigmodel.planning.get_balanced_memory
assert Accelerator is accel_train.accelerator.Accelerator
assert sys.modules["accelerate.utils.modeling"] is sys.modules["accel_bigmodel.modeling"]
print(m.version("accelerate"), m.distribution("accelerate").metadata["Name"])
print(m.metadata("accelerate")["Home-page"])
"""


def test_switch_makes_accelerate_and_its_metadata_resolve_to_accel() -> None:
    done = _python(ALIAS_CHECK, env={"ACCEL_PROVIDE_ACCELERATE": "1"})
    assert done.returncode == 0, done.stderr
    from accel.accelerate_alias import DOCUMENTED_API_PAGE, PROVIDED_VERSION

    # the home page names where the served API is documented (sentence-transformers checks it to train)
    assert done.stdout.split() == [PROVIDED_VERSION, "accelerate", DOCUMENTED_API_PAGE]
    assert "huggingface" in DOCUMENTED_API_PAGE
    assert "+accel." in PROVIDED_VERSION


def test_without_the_switch_accelerate_does_not_exist() -> None:
    done = _python("import accel, accelerate", env={"ACCEL_PROVIDE_ACCELERATE": "0"})
    assert done.returncode != 0 and "No module named 'accelerate'" in done.stderr
    meta = _python(
        "import importlib.metadata as m\ntry:\n    m.version('accelerate')\nexcept m.PackageNotFoundError:\n    print('absent')",
        env={"ACCEL_PROVIDE_ACCELERATE": ""},
    )
    assert meta.stdout.strip() == "absent"


def test_install_from_python_and_refusal_next_to_a_real_accelerate(tmp_path) -> None:
    done = _python("from accel import accelerate_alias as a; print(a.install(), a.install())\n" + ALIAS_CHECK)
    assert done.returncode == 0 and done.stdout.startswith("True True"), done.stderr
    fake = tmp_path / "accelerate"
    fake.mkdir()
    (fake / "__init__.py").write_text("REAL = True\n")
    refused = _python(
        "import warnings\nwarnings.simplefilter('error')\nfrom accel import accelerate_alias as a\n"
        "try:\n    a.install()\nexcept UserWarning as w:\n    print('warned', w)\nimport accelerate\nprint(accelerate.REAL)",
        env={"PYTHONPATH": str(tmp_path)},
    )
    assert "warned" in refused.stdout and "real `accelerate` is installed" in refused.stdout
    assert refused.stdout.strip().endswith("True"), refused.stderr


def test_requested_reads_the_documented_variable() -> None:
    from accel.accelerate_alias import ENV_VAR, requested

    assert ENV_VAR == "ACCEL_PROVIDE_ACCELERATE"
    assert requested({ENV_VAR: "1"}) and requested({ENV_VAR: "true"}) and not requested({ENV_VAR: "0"})
    assert not requested({})


# -- FSDP / DeepSpeed placeholders ------------------------------------------------------------------


def test_names_transformers_imports_at_module_level_come_from_their_owners() -> None:
    from accel.utils import DummyOptim, get_active_deepspeed_plugin, load_fsdp_model, save_fsdp_model
    from accel.utils.deepspeed import HfDeepSpeedConfig

    assert save_fsdp_model.__module__ == load_fsdp_model.__module__ == "accel_train.fsdp_utils"
    for obj in (DummyOptim, HfDeepSpeedConfig, get_active_deepspeed_plugin):
        assert obj.__module__ == "accel_train.deepspeed_utils"

    class Sub(HfDeepSpeedConfig):  # transformers subclasses it at import time
        pass

    assert issubclass(Sub, HfDeepSpeedConfig)


# -- documented names -------------------------------------------------------------------------------


def test_documented_module_paths_and_top_level_names() -> None:
    import importlib

    for path in ("accel.utils.other", "accel.utils.tqdm", "accel.utils.torch_xla", "accel.memory_utils"):
        assert importlib.import_module(path) is not None
    import accel

    assert callable(accel.synchronize_rng_states) and isinstance(accel.is_rich_available(), bool)
    from accel.commands.config import default_config_file, load_config_from_file
    from accel.utils.constants import FSDP_AUTO_WRAP_POLICY, FSDP_SHARDING_STRATEGY
    from accel.utils.dataclasses import get_module_class_from_name

    assert "HYBRID_SHARD_ZERO2" in FSDP_SHARDING_STRATEGY and "NO_WRAP" in FSDP_AUTO_WRAP_POLICY
    assert default_config_file.endswith("default_config.yaml") and callable(load_config_from_file)
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    assert get_module_class_from_name(model, "ReLU") is torch.nn.ReLU
    assert get_module_class_from_name(model, "Nope") is None


@pytest.mark.parametrize(
    "name",
    [
        "is_pytest_available",
        "is_weights_only_available",
        "is_rocm_available",
        "is_xccl_available",
        "is_neuron_available",
        "is_habana_gaudi1",
        "is_import_timer_available",
    ],
)
def test_probes_answer_booleans(name: str) -> None:
    assert isinstance(getattr(accel.utils, name)(), bool)
    assert accel.utils.is_pytest_available() is True  # pytest runs this very test


def test_extract_model_from_parallel_and_compiled_modules() -> None:
    inner = torch.nn.Linear(3, 3)
    wrapped = torch.nn.DataParallel(inner)
    assert accel.utils.extract_model_from_parallel(wrapped) is inner
    # the eager backend: a real compiled wrapper (OptimizedModule) without importing inductor, which these
    # checks never run (about 2 CPU-s to import, more in a fresh venv that compiles its bytecode first)
    compiled = torch.compile(wrapped, backend="eager")
    assert accel.utils.is_compiled_module(compiled) and not accel.utils.is_compiled_module(inner)
    assert accel.utils.extract_model_from_parallel(compiled, keep_torch_compile=False) is inner
    kept = accel.utils.extract_model_from_parallel(compiled)
    assert accel.utils.is_compiled_module(kept) and kept._orig_mod is inner
    outer = torch.nn.Sequential(torch.nn.DataParallel(torch.nn.Linear(2, 2)))
    assert isinstance(accel.utils.extract_model_from_parallel(outer, recursive=True)[0], torch.nn.Linear)


def test_compile_regions_compiles_repeated_blocks_and_the_children_beside_them() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(3)]))
    assert not accel.utils.has_compiled_regions(model)
    out = accel.utils.compile_regions(model, backend="eager")  # nothing runs: no inductor needed
    assert out is model and accel.utils.has_compiled_regions(model)
    assert all(accel.utils.is_compiled_module(block) for block in model[1])
    assert accel.utils.is_compiled_module(model[0])  # as documented: the children beside the blocks too


def test_small_helpers() -> None:
    assert accel.utils.merge_dicts({"a": {"b": 1}, "c": 2}, {"a": {"d": 3}}) == {"a": {"d": 3, "b": 1}, "c": 2}
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    assert accel.utils.recursive_getattr(model, "0.weight") is model[0].weight
    assert accel.utils.get_pretty_name(torch.nn.Linear) == "Linear"
    assert accel.utils.get_pretty_name(model) == "Sequential"
    assert accel.utils.convert_bytes(1024**3) == "1.0 GB" or "GB" in accel.utils.convert_bytes(1024**3)
    assert [m.value for m in accel.utils.CustomDtype] == ["fp8", "int4", "int2"]
    assert issubclass(accel.utils.CannotPadNestedTensorWarning, UserWarning)
    assert not accel.utils.model_has_dtensor(model) and not accel.utils.is_peft_model(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        accel.utils.check_os_kernel()  # this machine's kernel is recent
    with pytest.raises(RuntimeError, match="only on google colab"):
        accel.utils.install_xla()


def test_save_load_and_safetensors_cleaning(tmp_path) -> None:
    weight = torch.randn(3, 3)
    shared = {"a": weight, "b": weight, "c": weight.t()}
    cleaned = accel.utils.clean_state_dict_for_safetensors(shared)
    assert list(cleaned) == ["a", "c"] and cleaned["c"].is_contiguous()
    accel.utils.save({"w": weight}, tmp_path / "w.bin")
    assert torch.equal(accel.utils.load(tmp_path / "w.bin")["w"], weight)
    accel.utils.save({"w": weight}, tmp_path / "w.safetensors", safe_serialization=True)
    assert torch.equal(accel.utils.load(tmp_path / "w.safetensors")["w"], weight)
    with pytest.raises(TypeError, match="dict of tensors"):
        accel.utils.save([1, 2], tmp_path / "x", safe_serialization=True)
    import accel.utils.other as other

    assert other.save is accel.utils.save and other.check_os_kernel is accel.utils.check_os_kernel


def test_purge_accelerate_environment_restores_the_variables() -> None:
    os.environ["ACCELERATE_KEEP_ME"] = "before"

    @accel.utils.purge_accelerate_environment
    def sets_variables() -> None:
        os.environ["ACCELERATE_NEW_ONE"] = "1"
        os.environ["ACCELERATE_KEEP_ME"] = "changed"

    try:
        sets_variables()
        assert "ACCELERATE_NEW_ONE" not in os.environ and os.environ["ACCELERATE_KEEP_ME"] == "before"
    finally:
        os.environ.pop("ACCELERATE_KEEP_ME", None)


def test_environment_helpers_on_a_cpu_machine() -> None:
    assert accel.utils.get_current_device_type() == ("cpu", "CPU")
    names, count = accel.utils.get_gpu_info()
    assert count == len(names)
    assert accel.utils.check_cuda_p2p_ib_support() is True
    assert accel.utils.set_numa_affinity(0) is None


def test_mixed_precision_helpers() -> None:
    import contextlib

    from accel_state.testing import reset_shared_state

    reset_shared_state()
    assert isinstance(accel.utils.get_mixed_precision_context_manager(native_amp=False), contextlib.nullcontext)
    scaler = accel.utils.get_grad_scaler(init_scale=1024.0)
    assert isinstance(scaler, torch.amp.GradScaler)
    reset_shared_state()


def test_utils_names_listed_for_libraries_all_resolve() -> None:
    from accel._exports import clients

    for name in clients.UTILS:
        assert getattr(accel.utils, name) is not None, name
    assert set(clients.UTILS) <= set(_exports.UTILS)


def test_documented_submodules_are_package_attributes() -> None:
    code = (
        "import sys, accel\nassert 'torch' not in sys.modules\n"
        "import accel_state.state, accel_bigmodel.big_modeling\n"
        "assert accel.state is accel_state.state and accel.big_modeling is accel_bigmodel.big_modeling\n"
        "assert accel.commands.__name__ == 'accel.commands'\nprint('ok')"
    )
    done = _python(code)
    assert done.stdout.strip() == "ok", done.stderr
    assert isinstance(accel.utils.is_amdsmi_available(), bool)
