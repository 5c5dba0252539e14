"""DeepSpeed configuration in one process: the plugin from code, the launcher and config files, the
"auto" values, the documented helpers, and the errors for bad input. No engine is started here."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest
import torch

from accel_state.imports import is_deepspeed_available
from accel_state.install_hints import install_hint
from accel_train import deepspeed_config as dsc
from accel_train.deepspeed_plugin import DeepSpeedPlugin
from accel_train.deepspeed_utils import (
    DeepSpeedOptimizerWrapper,
    DeepSpeedSchedulerWrapper,
    DummyOptim,
    DummyScheduler,
    HfDeepSpeedConfig,
    deepspeed_required,
    get_active_deepspeed_plugin,
    map_pytorch_optim_to_deepspeed,
)

_LAUNCH_VARS = (
    "ACCELERATE_DEEPSPEED_CONFIG_FILE",
    "ACCELERATE_DEEPSPEED_ZERO_STAGE",
    "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE",
    "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE",
    "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_NVME_PATH",
    "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_NVME_PATH",
    "ACCELERATE_DEEPSPEED_ZERO3_INIT",
    "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL",
    "ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES",
    "ACCELERATE_CONFIG_DS_FIELDS",
    "ACCELERATE_GRADIENT_ACCUMULATION_STEPS",
    "ACCELERATE_GRADIENT_CLIPPING",
    "ACCELERATE_USE_DEEPSPEED",
    "ACCELERATE_MIXED_PRECISION",
)


@pytest.fixture(autouse=True)
def _no_launch_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _LAUNCH_VARS:
        monkeypatch.delenv(name, raising=False)


def _write(tmp_path, config: dict) -> str:
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config))
    return str(path)


# -- the plugin ------------------------------------------------------------------------------------


def test_plugin_without_file_is_the_configuration() -> None:
    plugin = DeepSpeedPlugin(
        zero_stage=3, offload_param_device="cpu", zero3_save_16bit_model=True, gradient_clipping=0.5
    )
    config = plugin.deepspeed_config
    assert config["zero_optimization"] == {
        "stage": 3,
        "offload_optimizer": {"device": "none"},
        "offload_param": {"device": "cpu"},
        "stage3_gather_16bit_weights_on_model_save": True,
    }
    assert config["train_batch_size"] == "auto" and config["train_micro_batch_size_per_gpu"] == "auto"
    assert config["gradient_accumulation_steps"] == "auto"
    assert config["gradient_clipping"] == 0.5
    assert plugin.zero3_init_flag is True  # ZeRO-3 without an explicit choice: on
    assert plugin.hf_ds_config.is_zero3() and plugin.hf_ds_config.is_offload()
    assert DeepSpeedPlugin().deepspeed_config["zero_optimization"]["stage"] == 2
    assert DeepSpeedPlugin().deepspeed_config["gradient_clipping"] == 0.0  # no value: no clipping


def test_plugin_reads_the_launcher_environment(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "1")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE", "nvme")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_NVME_PATH", str(tmp_path))
    monkeypatch.setenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "4")
    monkeypatch.setenv("ACCELERATE_GRADIENT_CLIPPING", "2.0")
    config = DeepSpeedPlugin().deepspeed_config
    assert config["zero_optimization"]["stage"] == 1
    assert config["zero_optimization"]["offload_optimizer"] == {"device": "nvme", "nvme_path": str(tmp_path)}
    assert config["gradient_accumulation_steps"] == 4 and config["gradient_clipping"] == 2.0


def test_config_file_auto_values_take_the_launch_flags(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """The documented scenario: every launch-flag key "auto" in the file, values from `accel launch`."""
    path = _write(
        tmp_path,
        {
            "bf16": {"enabled": "auto"},
            "zero_optimization": {
                "stage": "auto",
                "stage3_gather_16bit_weights_on_model_save": "auto",
                "offload_optimizer": {"device": "auto"},
                "offload_param": {"device": "auto"},
            },
            "gradient_clipping": "auto",
            "train_batch_size": "auto",
            "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": "auto",
            "steps_per_print": 2000000,
        },
    )
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_CONFIG_FILE", path)
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "3")
    monkeypatch.setenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "5")
    monkeypatch.setenv("ACCELERATE_GRADIENT_CLIPPING", "1.0")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE", "cpu")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE", "nvme")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL", "true")
    plugin = DeepSpeedPlugin()
    plugin.set_mixed_precision("fp16")
    config = plugin.deepspeed_config
    assert config["zero_optimization"] == {
        "stage": 3,
        "stage3_gather_16bit_weights_on_model_save": True,
        "offload_optimizer": {"device": "nvme"},
        "offload_param": {"device": "cpu"},
    }
    assert config["gradient_clipping"] == 1.0 and config["gradient_accumulation_steps"] == 5
    assert config["bf16"] == {"enabled": False}
    assert config["fp16"] == {"enabled": True, "auto_cast": True}
    assert config["steps_per_print"] == float("inf")
    assert dsc.effective_mixed_precision(config) == "fp16"


def test_config_file_keeps_its_concrete_values_over_launcher_defaults(monkeypatch, tmp_path) -> None:
    path = _write(tmp_path, {"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}})
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2")  # the launcher's default, always written
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE", "none")
    config = DeepSpeedPlugin(hf_ds_config=path).deepspeed_config
    assert config["zero_optimization"]["stage"] == 3
    assert config["zero_optimization"]["offload_param"]["device"] == "cpu"
    assert config["gradient_accumulation_steps"] == 1


def test_config_file_and_conflicting_launch_flags(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    path = _write(tmp_path, {"zero_optimization": {"stage": 2}, "gradient_accumulation_steps": 2})
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "3")
    monkeypatch.setenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "8")
    with pytest.raises(
        ValueError, match=r"zero_optimization\.stage: the DeepSpeed config has 2, the run has 3"
    ) as error:
        DeepSpeedPlugin(hf_ds_config=path)
    assert "gradient_accumulation_steps: the DeepSpeed config has 2, the run has 8" in str(error.value)
    with pytest.raises(ValueError, match="zero_optimization.stage"):
        DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 1}}, zero_stage=3)


def test_config_file_beside_other_accel_config_keys(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    path = _write(tmp_path, {"zero_optimization": {"stage": 2}})
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_CONFIG_FILE", path)
    monkeypatch.setenv(
        "ACCELERATE_CONFIG_DS_FIELDS",
        "deepspeed_config_file,zero3_init_flag,zero_stage,gradient_clipping,mixed_precision",
    )
    with pytest.raises(ValueError, match=r"would be ignored: \['gradient_clipping', 'mixed_precision', 'zero_stage'\]"):
        DeepSpeedPlugin()
    monkeypatch.setenv("ACCELERATE_CONFIG_DS_FIELDS", "deepspeed_config_file,zero3_init_flag,deepspeed_hostfile")
    assert DeepSpeedPlugin().deepspeed_config["zero_optimization"]["stage"] == 2


def test_bad_config_files(tmp_path) -> None:
    with pytest.raises(ValueError, match="no `zero_optimization` section"):
        DeepSpeedPlugin(hf_ds_config={"train_micro_batch_size_per_gpu": 2})
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        DeepSpeedPlugin(hf_ds_config=str(broken))
    with pytest.raises(ValueError, match="neither an existing JSON file nor a JSON string"):
        DeepSpeedPlugin(hf_ds_config=str(tmp_path / "missing.json"))
    with pytest.raises(TypeError, match="hf_ds_config"):
        DeepSpeedPlugin(hf_ds_config=3)


def test_zero3_init_flag_needs_stage_3(monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    # From code or from the documented ZeRO-2 launch config: turned off with a warning, not an error.
    with caplog.at_level(logging.WARNING):
        assert DeepSpeedPlugin(zero_stage=2, zero3_init_flag=True).zero3_init_flag is False
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO3_INIT", "true")
    with caplog.at_level(logging.WARNING):
        assert DeepSpeedPlugin(zero_stage=2).zero3_init_flag is False
    assert "zero3_init_flag applies to ZeRO stage 3 only" in caplog.text
    assert DeepSpeedPlugin(zero_stage=3).zero3_init_flag is True


def test_mixed_precision_against_the_config() -> None:
    plugin = DeepSpeedPlugin(hf_ds_config={"fp16": {"enabled": True}, "zero_optimization": {"stage": 2}})
    with pytest.raises(ValueError, match="mixed_precision='bf16' contradicts the DeepSpeed config, which enables fp16"):
        plugin.set_mixed_precision("bf16")
    plugin.set_mixed_precision("no")
    assert dsc.effective_mixed_precision(plugin.deepspeed_config) == "fp16"  # the config decides
    plugin = DeepSpeedPlugin(zero_stage=2)
    plugin.set_mixed_precision("bf16")
    assert plugin.deepspeed_config["bf16"] == {"enabled": True} and plugin.deepspeed_config["fp16"] == {
        "enabled": False
    }


def test_plugin_is_selected_through_the_state_only() -> None:
    with pytest.raises(ValueError, match="select_deepspeed_plugin"):
        DeepSpeedPlugin().select()


def test_fill_match_and_config_process() -> None:
    plugin = DeepSpeedPlugin(
        hf_ds_config={"zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"}, "gradient_clipping": 1.0}
    )
    mismatches: list[str] = []
    plugin.fill_match("gradient_clipping", mismatches, gradient_clipping=2.0)
    assert mismatches == ["gradient_clipping: the DeepSpeed config has 1.0, the run has 2.0"]
    plugin.deepspeed_config_process(
        must_match=False, **{"zero_optimization.reduce_bucket_size": 64, "gradient_clipping": 2.0}
    )
    assert plugin.get_value("zero_optimization.reduce_bucket_size") == 64 and not plugin.is_auto(
        "zero_optimization.reduce_bucket_size"
    )
    with pytest.raises(ValueError, match="contradicts the run's settings"):
        plugin.deepspeed_config_process(gradient_clipping=3.0)


def test_config_process_names_the_auto_values_it_was_not_given() -> None:
    # As documented: every "auto" needs a value; the ones missing from kwargs are named, not left unfilled.
    config = {"zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"}, "gradient_clipping": "auto"}
    config["train_micro_batch_size_per_gpu"] = 4
    plugin = DeepSpeedPlugin(hf_ds_config=config)
    with pytest.raises(ValueError, match="not found in kwargs") as raised:
        plugin.deepspeed_config_process(must_match=False, gradient_clipping=1.0)
    assert "['zero_optimization.reduce_bucket_size']" in str(raised.value)
    assert "without `auto`" in str(raised.value)
    with pytest.raises(ValueError, match="`zero_optimization.reduce_bucket_size` not found in kwargs"):
        plugin.fill_match("zero_optimization.reduce_bucket_size", [])
    plugin.fill_match("gradient_clipping", [])  # a concrete value needs nothing
    plugin.deepspeed_config_process(must_match=False, **{"zero_optimization.reduce_bucket_size": 8})
    assert list(dsc.auto_keys(plugin.deepspeed_config)) == []


# -- "auto" values resolved at prepare ----------------------------------------------------------------


def test_batch_sizes_from_the_loader() -> None:
    config = {
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
    }
    assert dsc.resolve_batch_sizes(config, micro=4, accumulation_steps=3, world_size=2) == 3
    assert config == {"train_batch_size": 24, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 3}
    # A concrete accumulation of the config wins over the Accelerator's.
    config = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": 5}
    assert dsc.resolve_batch_sizes(config, micro=2, accumulation_steps=1, world_size=2) == 5
    assert config["train_batch_size"] == 20
    assert dsc.micro_batch_size([8, 4]) == 4 and dsc.micro_batch_size([8, 4], take_min=False) == 8
    assert dsc.micro_batch_size([]) is None


def test_batch_size_errors() -> None:
    # As documented, a concrete micro batch size of the config wins over the loader's (with a warning).
    config = {"train_micro_batch_size_per_gpu": 8}
    assert dsc.resolve_batch_sizes(config, micro=4, accumulation_steps=1, world_size=2) == 1
    assert config == {"train_micro_batch_size_per_gpu": 8}
    # A frozen (evaluation) engine may keep its own micro batch size.
    assert dsc.resolve_batch_sizes({"train_micro_batch_size_per_gpu": 1}, 4, 1, 2, training=False) == 1
    with pytest.raises(ValueError, match=r"train_micro_batch_size_per_gpu as \"auto\".*none was prepared"):
        dsc.resolve_batch_sizes(
            {"train_micro_batch_size_per_gpu": "auto"}, micro=None, accumulation_steps=1, world_size=2
        )
    with pytest.raises(ValueError, match=r"train_batch_size=10, but train_micro_batch_size_per_gpu \(4\)"):
        dsc.resolve_batch_sizes({"train_batch_size": 10, "train_micro_batch_size_per_gpu": "auto"}, 4, 1, 2)
    with pytest.raises(ValueError, match="no integer batch size"):
        dsc.micro_batch_size([4, None])


def test_hidden_size_based_values() -> None:
    config = {"zero_optimization": {k.split(".")[1]: "auto" for k in dsc.HIDDEN_SIZE_KEYS}}
    model = SimpleNamespace(config=SimpleNamespace(hidden_size=32))
    assert dsc.hidden_size_values(config, model) == {
        "zero_optimization.reduce_bucket_size": 1024,
        "zero_optimization.stage3_prefetch_bucket_size": int(0.9 * 1024),
        "zero_optimization.stage3_param_persistence_threshold": 320,
    }
    assert dsc.hidden_size_of(SimpleNamespace(config=SimpleNamespace(hidden_sizes=[8, 64, 16]))) == 64
    with pytest.raises(ValueError, match="zero_optimization.reduce_bucket_size.*has neither"):
        dsc.hidden_size_values(config, torch.nn.Linear(2, 2))
    assert dsc.hidden_size_values({"zero_optimization": {"reduce_bucket_size": 5}}, torch.nn.Linear(2, 2)) == {}


def test_scheduler_values_and_unresolved_keys() -> None:
    assert dsc.scheduler_values(0.1, 10, 101, num_processes=2, split_batches=False) == {
        "scheduler.params.warmup_min_lr": 0,
        "scheduler.params.warmup_max_lr": 0.1,
        "scheduler.params.warmup_num_steps": 10,
        "scheduler.params.total_num_steps": 51,
    }
    assert dsc.scheduler_values(0.1, 10, 101, 2, split_batches=True)["scheduler.params.total_num_steps"] == 101
    config = {"optimizer": {"params": {"lr": "auto", "betas": "auto"}}, "a": 1}
    dsc.fill_auto(config, {"optimizer.params.lr": 0.5, "missing.key": 3})
    assert list(dsc.auto_keys(config)) == ["optimizer.params.betas"]
    assert "missing" not in config
    assert "optimizer.params.betas" in str(dsc.unresolved_error(list(dsc.auto_keys(config))))


def test_stand_ins_pair_with_the_config() -> None:
    from accel_train.strategies.deepspeed import _check_stand_ins

    params = [torch.nn.Parameter(torch.zeros(2))]
    torch_opt = torch.optim.SGD(params, lr=0.1)
    dummy = DummyOptim(params, lr=0.1)
    with pytest.raises(ValueError, match="defines an optimizer and the code passes a SGD"):
        _check_stand_ins({"optimizer": {}}, torch_opt, None)
    with pytest.raises(ValueError, match="config has no `optimizer`"):
        _check_stand_ins({}, dummy, None)
    with pytest.raises(ValueError, match="defines a scheduler and the code passes a StepLR"):
        _check_stand_ins({"scheduler": {}}, torch_opt, torch.optim.lr_scheduler.StepLR(torch_opt, 1))
    with pytest.raises(ValueError, match="no `scheduler` section"):
        _check_stand_ins({}, torch_opt, DummyScheduler(torch_opt))
    with pytest.raises(ValueError, match="must be a DummyScheduler"):
        _check_stand_ins({"optimizer": {}}, dummy, torch.optim.lr_scheduler.StepLR(torch_opt, 1))
    _check_stand_ins({}, torch_opt, DummyScheduler(torch_opt, lr_scheduler_callable=lambda o: None))
    _check_stand_ins({"optimizer": {}, "scheduler": {}}, dummy, DummyScheduler(dummy))


# -- the documented helpers ---------------------------------------------------------------------------


def test_hf_deepspeed_config_questions(tmp_path) -> None:
    config = HfDeepSpeedConfig(
        _write(
            tmp_path,
            {"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}, "fp16": {"enabled": "true"}},
        )
    )
    assert config.is_zero3() and not config.is_zero2() and config.is_offload()
    assert config.get_value("zero_optimization.offload_param.device") == "cpu"
    assert config.get_value("zero_optimization.nothing", 7) == 7
    assert config.is_true("fp16.enabled") and not config.is_false("fp16.enabled")
    config.del_config_sub_tree("zero_optimization.offload_param")
    assert config.get_value("zero_optimization.offload_param") is None
    with pytest.raises(ValueError, match="not in the DeepSpeed config"):
        config.del_config_sub_tree("bf16.enabled", must_exist=True)
    assert not HfDeepSpeedConfig({"zero_optimization": {"stage": 2}}).is_offload()


def test_dummy_objects_stand_in_and_refuse_to_step() -> None:
    params = [torch.nn.Parameter(torch.zeros(2))]
    optimizer = DummyOptim(iter(params), lr=0.3, weight_decay=0.1, betas=(0.8, 0.9))
    assert isinstance(optimizer, torch.optim.Optimizer) and optimizer.params == params
    assert optimizer.lr == 0.3 and optimizer.kwargs == {"betas": (0.8, 0.9)} and optimizer.defaults["lr"] == 0.3
    with pytest.raises(RuntimeError, match="accelerator.prepare"):
        optimizer.step()
    scheduler = DummyScheduler(optimizer, total_num_steps=10, warmup_num_steps=2)
    assert scheduler.optimizer is optimizer and scheduler.total_num_steps == 10
    with pytest.raises(RuntimeError, match="accelerator.prepare"):
        scheduler.step()


def test_wrappers_leave_stepping_to_the_engine() -> None:
    params = [torch.nn.Parameter(torch.ones(2))]
    inner = torch.optim.SGD(params, lr=1.0)
    params[0].grad = torch.ones(2)
    inner.overflow = True
    wrapper = DeepSpeedOptimizerWrapper(inner)
    wrapper.step()
    wrapper.zero_grad()
    assert torch.equal(params[0], torch.ones(2)) and params[0].grad is not None
    assert wrapper.step_was_skipped
    scheduler = torch.optim.lr_scheduler.StepLR(inner, step_size=1, gamma=0.5)
    DeepSpeedSchedulerWrapper(scheduler, wrapper).step()
    assert scheduler.get_last_lr() == [1.0]


def test_map_pytorch_optim_keeps_other_optimizers() -> None:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    assert map_pytorch_optim_to_deepspeed(optimizer) is optimizer


def test_deepspeed_missing_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import accel_train.deepspeed_utils as utils

    monkeypatch.setattr(utils, "is_deepspeed_available", lambda: False)

    @deepspeed_required
    def needs_it() -> int:
        return 1

    with pytest.raises(
        ImportError, match=r'needs_it needs DeepSpeed.*-c tools/constraints.txt "\./packages/accel-train\[deepspeed\]"'
    ):
        needs_it()
    from accel_train import Accelerator

    with pytest.raises(ImportError, match=r"accel-train\[deepspeed\]"):
        Accelerator(cpu=True, deepspeed_plugin=DeepSpeedPlugin())


def test_active_plugin_needs_deepspeed() -> None:
    with pytest.raises(ValueError, match="no DeepSpeed plugin is active"):
        get_active_deepspeed_plugin(SimpleNamespace(distributed_type="NO", deepspeed_plugins=None))


@pytest.mark.skipif(not is_deepspeed_available(), reason=f"needs DeepSpeed: {install_hint('accel-train', 'deepspeed')}")
def test_accelerator_takes_mixed_precision_from_the_config() -> None:
    from accel_train import Accelerator

    accelerator = Accelerator(
        cpu=True,
        deepspeed_plugin=DeepSpeedPlugin(hf_ds_config={"bf16": {"enabled": True}, "zero_optimization": {"stage": 2}}),
    )
    assert accelerator.mixed_precision == "bf16"
    assert accelerator.scaler is None
    assert get_active_deepspeed_plugin(accelerator.state) is accelerator.state.deepspeed_plugin
    with pytest.raises(ValueError, match="contradicts the DeepSpeed config"):
        from accel_state.testing import reset_shared_state

        reset_shared_state()
        Accelerator(
            cpu=True,
            mixed_precision="fp16",
            deepspeed_plugin=DeepSpeedPlugin(
                hf_ds_config={"bf16": {"enabled": True}, "zero_optimization": {"stage": 2}}
            ),
        )


def test_engine_precision_does_no_autocast_and_no_scaling() -> None:
    from accel_train.precisions.amp import AutocastPrecision
    from accel_train.strategies.deepspeed import DeepSpeedStrategy, EnginePrecision

    assert DeepSpeedStrategy.precision_for(AutocastPrecision, "bf16") is EnginePrecision
    precision = EnginePrecision("bf16", torch.device("cpu"))
    assert not precision.native_amp and precision.scaler is None and precision.state_dict() is None
    model = torch.nn.Linear(2, 2)
    assert precision.convert_module(model) is model
    # Until the connector asks precision_for, the scaler factory keeps fp16 without a torch scaler.
    factory = DeepSpeedStrategy.grad_scaler_factory()
    assert factory is not None and factory("cpu") is None


def test_ulysses_adapter_leaves_loaders_alone_without_sequence_parallelism() -> None:
    from accel_train.strategies.base import Strategy
    from accel_train.strategies.deepspeed import DeepSpeedStrategy, EnginePrecision

    loader = torch.utils.data.DataLoader(list(range(4)))
    state = SimpleNamespace(parallelism_config=None, device=torch.device("cpu"))
    strategy = DeepSpeedStrategy(state, EnginePrecision("no", torch.device("cpu")))
    assert strategy.ulysses_dl_adapter(loader, torch.nn.Linear(1, 1)) is loader
    state.parallelism_config = SimpleNamespace(sp_enabled=True, sp_backend="torch")
    assert strategy.ulysses_dl_adapter(loader, torch.nn.Linear(1, 1)) is loader
    assert Strategy(state, EnginePrecision("no", torch.device("cpu"))).ulysses_dl_adapter(loader, None) is loader
