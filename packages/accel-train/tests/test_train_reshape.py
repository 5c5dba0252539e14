"""The reshaped package (issue 23): backend folders behind the old module paths, the strategy interface
the next backends need (data-loader hook, pipeline dimension, one precision table), the one checkpoint
walk, and ``extract_model_from_parallel`` as an alias of ``unwrap_model``. One process."""

from __future__ import annotations

import importlib

import pytest
import torch

import accel_train
from accel_state.enums import PrecisionType
from accel_train import Accelerator
from accel_train.strategies.base import ParallelDims, Strategy

# -- old module paths ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("old", "new"), sorted(accel_train.MOVED_MODULES.items()))
def test_old_module_paths_are_the_moved_modules(old: str, new: str) -> None:
    assert importlib.import_module(old) is importlib.import_module(new)


def test_patching_an_old_path_patches_the_running_code(monkeypatch: pytest.MonkeyPatch) -> None:
    import accel_train.fsdp_utils as old
    from accel_train.strategies.fsdp import utils as new

    monkeypatch.setattr("accel_train.fsdp_utils.get_fsdp2_grad_scaler", lambda **kwargs: "patched")
    assert new.get_fsdp2_grad_scaler() == "patched" and old is new


def test_no_backend_module_at_the_package_root() -> None:
    """A backend's code lives in its folder under strategies/: no root module is named for a backend or
    imports a backend library when it is imported (the old root paths are aliases, `MOVED_MODULES`)."""
    import ast
    import pathlib

    from accel_train.strategies import BACKENDS

    root = pathlib.Path(accel_train.__file__).parent
    backend_words = {b.name.split("_")[0] for b in BACKENDS} - {"single"}
    libraries = {"deepspeed", "megatron", "torch_xla", "transformer_engine"}
    for path in sorted(root.glob("*.py")):
        assert path.stem.split("_")[0] not in backend_words, f"{path.name} is a backend module at the root"
        for node in ast.parse(path.read_text(encoding="utf-8")).body:  # top-level imports only
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            assert not {n.split(".")[0] for n in names} & libraries, f"{path.name} imports {names} at import"


# -- strategy interface ------------------------------------------------------------------------------------


def test_parallel_dims_has_a_pipeline_dimension_checked_when_built() -> None:
    dims = ParallelDims(dp_shard_size=2, tp_size=2, pp_size=3, dp_shard_rank=1, pp_rank=2)
    assert dims.world_size == 12 and dims.data_parallel_size == 2 and dims.pp_rank == 2
    with pytest.raises(ValueError, match=r"pp_size must be an integer >= 1, got 0"):
        ParallelDims(pp_size=0)
    with pytest.raises(ValueError, match=r"ParallelDims.pp_rank must be in \[0, 2\), got 2"):
        ParallelDims(pp_size=2, pp_rank=2)
    with pytest.raises(ValueError, match=r"tp_rank must be in \[0, 1\)"):
        ParallelDims(tp_rank=1)


def test_prepare_data_loader_goes_through_the_strategy() -> None:
    from accel_train.strategies import register_strategy
    from accel_train.strategies.single_device import SingleDeviceStrategy

    seen = []

    class Recording(SingleDeviceStrategy):
        def setup_data_loader(self, data_loader, **options):
            seen.append(sorted(options))
            return super().setup_data_loader(data_loader, **options)

    register_strategy("single_device", Recording, replace=True)
    try:
        accelerator = Accelerator(cpu=True)
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(6.0)), batch_size=2)
        prepared = accelerator.prepare(loader)
        assert [batch[0].tolist() for batch in prepared] == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
        assert seen and "split_batches" in seen[0] and "put_on_device" in seen[0]
    finally:
        register_strategy("single_device", SingleDeviceStrategy, replace=True)


def test_a_strategy_declares_the_precisions_it_runs_with() -> None:
    class NoHalf(Strategy):
        name = "no_half"
        precisions = frozenset({PrecisionType.NO, PrecisionType.BF16})

    NoHalf.check_precision(None, PrecisionType.BF16)
    with pytest.raises(
        ValueError, match=r"mixed_precision='fp16' cannot run with the no_half strategy; it runs with \['bf16', 'no'\]"
    ):
        NoHalf.check_precision(None, PrecisionType.FP16)


def test_deepspeed_table_takes_fp8_with_its_engine_precision() -> None:
    from accel_train.precisions.fp8 import EngineFP8Precision, FP8Precision
    from accel_train.strategies.deepspeed.strategy import DeepSpeedStrategy, EnginePrecision

    DeepSpeedStrategy.check_precision(None, PrecisionType.FP8)  # torchao layers, the engine in bf16
    assert DeepSpeedStrategy.precision_for(FP8Precision, "fp8") is EngineFP8Precision
    assert DeepSpeedStrategy.precision_for(FP8Precision, "bf16") is EnginePrecision


# -- checkpoint names from one table -------------------------------------------------------------------------


def test_checkpoint_names_come_from_one_table() -> None:
    from accel_train import checkpointing as ckpt

    assert ckpt.sharded_model_dir(0) == "pytorch_model_fsdp_0" and ckpt.sharded_optimizer_dir(1) == "optimizer_1"
    assert ckpt.model_file(0, True) == "model.safetensors" and ckpt.model_file(2, False) == "pytorch_model_2.bin"
    assert ckpt.optimizer_file(0) == "optimizer.bin" and ckpt.scheduler_file(1) == "scheduler_1.bin"
    assert ckpt.rng_file(3) == "random_states_3.safetensors" and ckpt.custom_file(0) == "custom_checkpoint_0.pkl"


# -- extract_model_from_parallel ------------------------------------------------------------------------------


class _RecordsAutocast(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(2, 2)
        self.autocast_seen: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.autocast_seen.append(torch.is_autocast_enabled("cpu"))
        return self.linear(x)


def test_extract_model_without_fp32_wrapper_drops_the_autocast_forward() -> None:
    from accel_train.other import extract_model_from_parallel

    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    model = accelerator.prepare(_RecordsAutocast())
    model(torch.ones(1, 2))
    assert model.autocast_seen == [True]  # prepared: the forward runs under bf16 autocast

    kept = extract_model_from_parallel(model)
    kept(torch.ones(1, 2))
    assert model.autocast_seen == [True, True]

    bare = extract_model_from_parallel(model, keep_fp32_wrapper=False)
    assert isinstance(bare, _RecordsAutocast)
    out = bare(torch.ones(1, 2))
    assert bare.autocast_seen[-1] is False and out.dtype == torch.float32
    assert "_accel_original_forward" not in bare.__dict__


def test_other_functions_are_the_wrappers_functions() -> None:
    from accel_train import other, wrappers

    assert other.extract_model_from_parallel is wrappers.unwrap_model
    assert other.compile_regions is wrappers.compile_regions
    assert other.has_compiled_regions is wrappers.has_compiled_regions
    assert other.is_compiled_module is wrappers.is_compiled
    assert other.compile_regions_fsdp2 is other.compile_regions_deepspeed is wrappers.compile_regions_in_place


# -- DeepSpeed: the ZeRO stage is resolved once, after "auto" is filled ---------------------------------------


def test_deepspeed_auto_stage_with_zero_stage_3_gives_zero3_init(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    import json

    from accel_train.strategies.deepspeed.plugin import DeepSpeedPlugin

    for name in (
        "ACCELERATE_DEEPSPEED_ZERO_STAGE",
        "ACCELERATE_DEEPSPEED_ZERO3_INIT",
        "ACCELERATE_DEEPSPEED_CONFIG_FILE",
    ):
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": "auto"}, "train_micro_batch_size_per_gpu": "auto"}))
    plugin = DeepSpeedPlugin(hf_ds_config=str(path), zero_stage=3)
    assert plugin.deepspeed_config["zero_optimization"]["stage"] == 3
    assert plugin.hf_ds_config.is_zero3() and plugin.zero3_init_flag is True
    # without the stage anywhere, the file's "auto" leaves ZeRO-3 init off
    path.write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    assert DeepSpeedPlugin(hf_ds_config=str(path)).zero3_init_flag is False
