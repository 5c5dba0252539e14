"""DeepSpeed on two real gloo processes (CPU): ZeRO 1-3 against DDP, checkpoints, config-defined
optimizers, CPU offload, and two plugins (teacher / student).

DeepSpeed compiles its small C++ ops on first use (cached in ~/.cache/torch_extensions), so these
tests share one pool of processes and use torch optimizers except in the offload test.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from train_helpers import regression_dataset

from accel_state.imports import is_deepspeed_available
from accel_state.install_hints import install_hint
from accel_state.testing import DistributedPool, reset_shared_state

pytestmark = [
    pytest.mark.skipif(
        not is_deepspeed_available(), reason=f"needs DeepSpeed: {install_hint('accel-train', 'deepspeed')}"
    ),
    # A run that keeps working is only slow (building DeepSpeed's CPU Adam on a loaded machine took
    # 15 minutes); a hang is caught by the pool's idle limit below, so the per-test limit is only the
    # ceiling for a rank that spins.
    pytest.mark.timeout(3600),
]

STEPS = 6
BATCH = 4


@pytest.fixture
def ds_pool(pools) -> DistributedPool:
    """The session's two processes (conftest ``pools``: 600 s in which the ranks use no CPU is a hang, not
    a loaded machine); DeepSpeed's engines run there as in the resharding tests."""
    return pools(2)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def _loader(batch: int = BATCH) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(regression_dataset(2 * batch * STEPS), batch_size=batch)


def _train(accelerator, model, optimizer, loader, scheduler=None, steps: int | None = None) -> None:
    for index, (x, y) in enumerate(loader):
        if steps is not None and index >= steps:
            break
        with accelerator.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            optimizer.zero_grad()


def _full_state(accelerator, model) -> dict:
    return {k: v.detach().float().cpu() for k, v in accelerator.get_state_dict(model).items()}


# -- rank functions -------------------------------------------------------------------------------


def rank_ddp_reference(accumulation: int) -> dict:
    reset_shared_state()
    from accel_train import Accelerator

    accelerator = Accelerator(gradient_accumulation_steps=accumulation)
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.01)
    model, optimizer, loader = accelerator.prepare(model, optimizer, _loader())
    _train(accelerator, model, optimizer, loader)
    return _full_state(accelerator, model)


def rank_zero_training(stage: int, accumulation: int) -> dict:
    reset_shared_state()
    from accel_train import Accelerator, DeepSpeedPlugin
    from accel_train.deepspeed_utils import DeepSpeedEngineWrapper, DeepSpeedOptimizerWrapper

    plugin = DeepSpeedPlugin(zero_stage=stage, zero3_save_16bit_model=True)
    accelerator = Accelerator(deepspeed_plugin=plugin, gradient_accumulation_steps=accumulation)
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.01)
    model, optimizer, loader = accelerator.prepare(model, optimizer, _loader())
    _train(accelerator, model, optimizer, loader)
    strategy = accelerator._strategy
    return {
        "state": _full_state(accelerator, model),
        "engine": type(model).__name__,
        "optimizer": type(optimizer).__name__,
        "wrapper": isinstance(strategy.engine_wrapper, DeepSpeedEngineWrapper)
        and isinstance(optimizer, DeepSpeedOptimizerWrapper),
        "config": {
            "micro": plugin.deepspeed_config["train_micro_batch_size_per_gpu"],
            "total": plugin.deepspeed_config["train_batch_size"],
            "accumulation": plugin.deepspeed_config["gradient_accumulation_steps"],
            "stage": model.zero_optimization_stage(),
        },
        "unwrapped": type(accelerator.unwrap_model(model)).__name__,
    }


@pytest.mark.parametrize(("stage", "accumulation"), [(1, 1), (2, 2), (3, 1)])
def test_zero_stages_train_like_ddp(ds_pool: DistributedPool, stage: int, accumulation: int) -> None:
    reference = ds_pool.run(rank_ddp_reference, accumulation)
    results = ds_pool.run(rank_zero_training, stage, accumulation)
    for rank, result in enumerate(results):
        assert result["engine"] == "DeepSpeedEngine"
        assert result["wrapper"]
        assert result["unwrapped"] == "Sequential"
        assert result["config"] == {
            "micro": BATCH,
            "total": BATCH * accumulation * 2,
            "accumulation": accumulation,
            "stage": stage,
        }
        assert result["state"].keys() == reference[rank].keys()
        for key, value in result["state"].items():
            torch.testing.assert_close(value, reference[rank][key], atol=1e-5, rtol=0)
    initial = _model().state_dict()
    assert any(not torch.allclose(initial[k], results[0]["state"][k]) for k in initial), "training changed nothing"


# -- save_state / load_state through the engine's checkpoints ---------------------------------------


def rank_zero3_resume(folder: str, save_at: int | None) -> dict:
    """Train STEPS batches; with ``save_at`` save there. With ``save_at=None`` resume from ``folder``."""
    reset_shared_state()
    from accel_train import Accelerator, DeepSpeedPlugin

    plugin = DeepSpeedPlugin(zero_stage=3, zero3_save_16bit_model=True)
    accelerator = Accelerator(deepspeed_plugin=plugin)
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, _loader(), scheduler)
    entries: list[str] = []
    if save_at is None:
        accelerator.load_state(folder)
        loader = accelerator.skip_first_batches(loader, accelerator.step)
        _train(accelerator, model, optimizer, loader, scheduler)
    else:
        _train(accelerator, model, optimizer, loader, scheduler, steps=save_at)
        accelerator.save_state(folder)
        entries = sorted(os.listdir(folder))
        accelerator.wait_for_everyone()
        for index, (x, y) in enumerate(loader):
            if index < save_at:
                continue
            with accelerator.accumulate(model):
                accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
    return {"state": _full_state(accelerator, model), "lr": scheduler.get_last_lr(), "entries": entries}


def test_zero3_save_and_resume_equals_uninterrupted_run(ds_pool: DistributedPool, tmp_path) -> None:
    folder = str(tmp_path / "ckpt")
    uninterrupted = ds_pool.run(rank_zero3_resume, folder, 3)
    assert "pytorch_model" in uninterrupted[0]["entries"]
    assert "deepspeed_optimizer.json" in uninterrupted[0]["entries"]
    assert "scheduler.bin" in uninterrupted[0]["entries"]
    shards = os.listdir(os.path.join(folder, "pytorch_model"))
    assert any("optim_states" in name for name in shards), shards
    marker = json.loads(open(os.path.join(folder, "deepspeed_optimizer.json")).read())
    assert marker["saved_in"] == "pytorch_model" and marker["zero_stage"] == 3
    resumed = ds_pool.run(rank_zero3_resume, folder, None)
    for rank in range(2):
        assert resumed[rank]["lr"] == uninterrupted[rank]["lr"]
        for key, value in uninterrupted[rank]["state"].items():
            torch.testing.assert_close(resumed[rank]["state"][key], value, atol=1e-6, rtol=0)


# -- the optimizer and scheduler of the DeepSpeed config (DummyOptim / DummyScheduler) -------------

DS_OPTIMIZER_CONFIG = {
    "optimizer": {
        "type": "AdamW",
        "params": {"lr": "auto", "weight_decay": "auto", "torch_adam": True, "adam_w_mode": True},
    },
    "scheduler": {
        "type": "WarmupDecayLR",
        "params": {
            "warmup_min_lr": "auto",
            "warmup_max_lr": "auto",
            "warmup_num_steps": "auto",
            "total_num_steps": "auto",
        },
    },
    "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"},
    "gradient_accumulation_steps": 1,
    "gradient_clipping": "auto",
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
}


class _WithConfig(torch.nn.Module):
    """A model with a Transformers-like ``config.hidden_size`` (for the hidden-size based "auto" keys)."""

    def __init__(self, hidden: int = 16) -> None:
        super().__init__()
        from types import SimpleNamespace

        self.config = SimpleNamespace(hidden_size=hidden)
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def rank_dummy_optim() -> dict:
    reset_shared_state()
    from accel_train import Accelerator, DeepSpeedPlugin
    from accel_train.deepspeed_utils import DeepSpeedSchedulerWrapper, DummyOptim, DummyScheduler

    plugin = DeepSpeedPlugin(hf_ds_config=DS_OPTIMIZER_CONFIG)
    accelerator = Accelerator(deepspeed_plugin=plugin)
    model = _WithConfig()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = DummyOptim(model.parameters(), lr=0.02, weight_decay=0.001)
    scheduler = DummyScheduler(optimizer, total_num_steps=2 * STEPS, warmup_num_steps=2)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, _loader(), scheduler)
    lrs = []
    losses = []
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        losses.append(loss.item())
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        lrs.append(scheduler.get_last_lr()[0])
    after = _full_state(accelerator, model)
    return {
        "config": plugin.deepspeed_config,
        "optimizer": type(optimizer.optimizer).__name__,
        "scheduler": isinstance(scheduler, DeepSpeedSchedulerWrapper),
        "lrs": lrs,
        "losses": losses,
        "changed": any(not torch.equal(before[k], after[k]) for k in before),
    }


def test_optimizer_and_scheduler_of_the_config_train(ds_pool: DistributedPool) -> None:
    result = ds_pool.run(rank_dummy_optim)[0]
    config = result["config"]
    assert config["optimizer"]["params"]["lr"] == 0.02
    assert config["optimizer"]["params"]["weight_decay"] == 0.001
    assert config["scheduler"]["params"] == {
        "warmup_min_lr": 0,
        "warmup_max_lr": 0.02,
        "warmup_num_steps": 2,
        "total_num_steps": STEPS,  # 2 * STEPS batches over 2 processes
    }
    assert config["zero_optimization"]["reduce_bucket_size"] == 16 * 16
    assert config["gradient_clipping"] == 1.0
    assert config["train_micro_batch_size_per_gpu"] == BATCH and config["train_batch_size"] == 2 * BATCH
    assert result["optimizer"] == "DeepSpeedZeroOptimizer"
    assert result["scheduler"]
    assert result["changed"]
    assert result["lrs"][0] < result["lrs"][1]  # warm-up, then decay
    assert result["lrs"][-1] < max(result["lrs"])
    assert result["losses"][-1] < result["losses"][0]


# -- optimizer offload to CPU (DeepSpeedCPUAdam) --------------------------------------------------


def rank_offload() -> dict:
    reset_shared_state()
    from accel_train import Accelerator, DeepSpeedPlugin

    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2, offload_optimizer_device="cpu"))
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.01)
    model, optimizer, loader = accelerator.prepare(model, optimizer, _loader())
    _train(accelerator, model, optimizer, loader)
    return {"state": _full_state(accelerator, model), "inner": type(model.basic_optimizer).__name__}


def test_optimizer_offload_to_cpu_trains(ds_pool: DistributedPool) -> None:
    reference = ds_pool.run(rank_ddp_reference, 1)[0]
    result = ds_pool.run(rank_offload)[0]
    assert result["inner"] == "DeepSpeedCPUAdam"
    for key, value in result["state"].items():
        torch.testing.assert_close(value, reference[key], atol=1e-4, rtol=0)


# -- several plugins: a frozen ZeRO-3 teacher and a ZeRO-2 student --------------------------------

TEACHER_CONFIG = {
    "bf16": {"enabled": "auto"},
    "zero_optimization": {
        "stage": 3,
        "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto",
        "stage3_max_live_parameters": "auto",
        "stage3_max_reuse_distance": "auto",
        "stage3_gather_16bit_weights_on_model_save": True,
    },
    "train_micro_batch_size_per_gpu": 1,
}

STUDENT_CONFIG = {
    "bf16": {"enabled": "auto"},
    "zero_optimization": {"stage": 2},
    "gradient_accumulation_steps": 1,
    "gradient_clipping": 0.0,
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
}


def rank_distillation(folder: str) -> dict:
    reset_shared_state()
    from accel_train import Accelerator, DeepSpeedPlugin
    from accel_train.deepspeed_utils import get_active_deepspeed_plugin

    plugins = {
        "student": DeepSpeedPlugin(hf_ds_config=STUDENT_CONFIG),
        "teacher": DeepSpeedPlugin(hf_ds_config=TEACHER_CONFIG),
    }
    accelerator = Accelerator(deepspeed_plugins=plugins)
    first_active = get_active_deepspeed_plugin(accelerator.state) is plugins["student"]
    student = _model()
    optimizer = torch.optim.AdamW(student.parameters(), lr=0.01)
    student, optimizer, loader = accelerator.prepare(student, optimizer, _loader())
    accelerator.state.select_deepspeed_plugin("teacher")
    teacher_active = get_active_deepspeed_plugin(accelerator.state) is plugins["teacher"]
    teacher = _WithConfig(hidden=8)
    teacher_before = {k: v.clone() for k, v in teacher.state_dict().items()}
    teacher = accelerator.prepare(teacher)
    teacher.eval()
    student.train()
    losses = []
    for x, y in loader:
        with torch.no_grad():
            target = teacher(x)
        loss = torch.nn.functional.mse_loss(student(x), target) + torch.nn.functional.mse_loss(student(x), y)
        losses.append(loss.item())
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    teacher_after = _full_state(accelerator, teacher)
    student_after = _full_state(accelerator, student)
    # Both engines go into one checkpoint (the frozen ZeRO-3 teacher as gathered weights) and come back.
    accelerator.save_state(folder)
    for engine in (student, teacher):
        for param in engine.module.parameters():
            if hasattr(param, "ds_id"):
                with __import__("deepspeed").zero.GatheredParameters([param], modifier_rank=0):
                    param.data.zero_()
            else:
                param.data.zero_()
    accelerator.load_state(folder)
    teacher_back = _full_state(accelerator, teacher)
    student_back = _full_state(accelerator, student)
    restored = all(torch.equal(teacher_back[k], v) for k, v in teacher_after.items()) and all(
        torch.equal(student_back[k], v) for k, v in student_after.items()
    )
    return {
        "restored": restored,
        "first_active": first_active,
        "teacher_active": teacher_active,
        "stages": (student.zero_optimization_stage(), teacher.zero_optimization_stage()),
        "teacher_frozen": all(torch.equal(teacher_before[k], teacher_after[k]) for k in teacher_before),
        "teacher_buckets": plugins["teacher"].deepspeed_config["zero_optimization"]["reduce_bucket_size"],
        "losses": losses,
    }


def test_teacher_and_student_under_two_plugins(ds_pool: DistributedPool, tmp_path) -> None:
    result = ds_pool.run(rank_distillation, str(tmp_path / "ckpt"))[0]
    assert result["restored"]
    assert result["first_active"] and result["teacher_active"]
    assert result["stages"] == (2, 3)
    assert result["teacher_frozen"]
    assert result["teacher_buckets"] == 8 * 8
    assert result["losses"][-1] < result["losses"][0]


# -- ZeRO-3 construction, and bad input that needs an engine ------------------------------------------


def rank_zero3_init() -> dict:
    reset_shared_state()
    from accel_train import Accelerator, DeepSpeedPlugin

    plugin = DeepSpeedPlugin(zero_stage=3, zero3_init_flag=True, zero3_save_16bit_model=True)
    accelerator = Accelerator(deepspeed_plugin=plugin)
    with accelerator.state.deepspeed_plugin.zero3_init_context_manager(enable=plugin.zero3_init_flag):
        model = _model()
    partitioned = all(hasattr(p, "ds_id") and p.numel() == 0 for p in model.parameters())
    full_sizes = sorted(p.ds_numel for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    model, optimizer, loader = accelerator.prepare(model, optimizer, _loader())
    _train(accelerator, model, optimizer, loader, steps=2)
    state = _full_state(accelerator, model)
    return {
        "partitioned": partitioned,
        "full_sizes": full_sizes,
        "shapes": {k: tuple(v.shape) for k, v in state.items()},
    }


def test_zero3_init_builds_models_partitioned(ds_pool: DistributedPool) -> None:
    result = ds_pool.run(rank_zero3_init)[0]
    assert result["partitioned"]
    assert result["full_sizes"] == [1, 16, 16, 64]
    assert result["shapes"] == {"0.weight": (16, 4), "0.bias": (16,), "2.weight": (1, 16), "2.bias": (1,)}


def rank_bad_input(case: str) -> str:
    reset_shared_state()
    from accel_train import Accelerator, DeepSpeedPlugin

    if case == "zero3_without_16bit":
        accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=3))
        model = _model()
        model, optimizer, _ = accelerator.prepare(model, torch.optim.AdamW(model.parameters()), _loader())
        try:
            accelerator.save_model(model, "unused")
        except ValueError as error:
            return str(error)
        return "no error"
    if case == "micro_batch":
        plugin = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 8})
        accelerator = Accelerator(deepspeed_plugin=plugin)
        model = _model()
        # As documented, the config's micro batch size wins over the loader's (with a warning).
        accelerator.prepare(model, torch.optim.AdamW(model.parameters()), _loader())
        return f"micro={plugin.deepspeed_config['train_micro_batch_size_per_gpu']}"
    if case == "untested_optimizer":
        # A client optimizer DeepSpeed does not test with ZeRO: allowed, as documented.
        plugin = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 2}, "gradient_clipping": 0.0})
        accelerator = Accelerator(deepspeed_plugin=plugin)
        model = _model()
        before = [p.detach().clone() for p in model.parameters()]
        model, optimizer, loader = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), _loader())
        _train(accelerator, model, optimizer, loader, steps=2)
        after = list(accelerator.get_state_dict(model).values())
        moved = any(not torch.equal(a, b) for a, b in zip(before, after))
        return f"trained={moved} allow={plugin.deepspeed_config['zero_allow_untested_optimizer']}"
    if case == "documented_api":
        # A script written for the documented system: the "zero2" spelling, a loader prepared in its own
        # call and one in a failed call (neither sizes the batch), the resolved config on the accelerator,
        # and the gradient norm as a float.
        plugin = DeepSpeedPlugin(zero_stage="zero2", gradient_clipping=1.0)
        accelerator = Accelerator(deepspeed_plugin=plugin)
        accelerator.prepare(_loader(batch=1))
        try:
            accelerator.prepare(_model(), _model(), _loader(batch=2))
        except ValueError:
            pass
        model = _model()
        model, optimizer, loader = accelerator.prepare(model, torch.optim.AdamW(model.parameters()), _loader())
        x, y = next(iter(loader))
        accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
        norm = accelerator.clip_grad_norm_(model.parameters(), 1.0)
        config = accelerator.deepspeed_config
        return (
            f"stage={model.zero_optimization_stage()} micro={config['train_micro_batch_size_per_gpu']} "
            f"same={config is plugin.deepspeed_config} auto={'auto' in json.dumps(config)} "
            f"norm={type(norm).__name__}:{norm > 0}"
        )
    raise AssertionError(case)


def test_zero3_save_model_without_16bit_export_says_how_to_gather(ds_pool: DistributedPool) -> None:
    message = ds_pool.run(rank_bad_input, "zero3_without_16bit")[0]
    assert "zero3_save_16bit_model=True" in message and "stage3_gather_16bit_weights_on_model_save" in message
    assert "zero_to_fp32.py" in message
    assert "Cannot get 16bit model weights because `stage3_gather_16bit_weights_on_model_save`" in message


def test_micro_batch_size_of_the_config_wins_over_the_loader(ds_pool: DistributedPool) -> None:
    assert ds_pool.run(rank_bad_input, "micro_batch") == ["micro=8", "micro=8"]


def test_untested_client_optimizer_is_allowed_with_zero(ds_pool: DistributedPool) -> None:
    assert ds_pool.run(rank_bad_input, "untested_optimizer")[0] == "trained=True allow=True"


def test_a_script_for_the_documented_system_reads_the_documented_values(ds_pool: DistributedPool) -> None:
    assert (
        ds_pool.run(rank_bad_input, "documented_api")
        == [f"stage=2 micro={BATCH} same=True auto=False norm=float:True"] * 2
    )


def rank_config_decides_precision() -> dict:
    reset_shared_state()
    from accel_train import Accelerator, DeepSpeedPlugin

    plugin = DeepSpeedPlugin(hf_ds_config={"bf16": {"enabled": True}, "zero_optimization": {"stage": 2}})
    accelerator = Accelerator(deepspeed_plugin=plugin)  # no mixed_precision asked for
    return {
        "reported": accelerator.mixed_precision,
        "precision": accelerator.precision.mode,
        "fp16": plugin.deepspeed_config["fp16"],
    }


def test_a_config_that_enables_bf16_decides_the_precision_the_run_is_built_with(ds_pool: DistributedPool) -> None:
    """As documented, the DeepSpeed config decides; the connector resolves it before the precision is built,
    so what the Accelerator reports and the precision it trains with agree."""
    result = ds_pool.run(rank_config_decides_precision)[0]
    assert result == {"reported": "bf16", "precision": "bf16", "fp16": {"enabled": False}}
