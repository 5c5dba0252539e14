"""The documented DeepSpeed helpers (``accel.utils.deepspeed``).

``DummyOptim`` / ``DummyScheduler`` stand for the optimizer and scheduler of a DeepSpeed config in a
``prepare`` call; the three wrappers are what ``prepare`` returns around the engine, its optimizer
and its scheduler (the engine steps, so their ``step`` / ``zero_grad`` do nothing);
``HfDeepSpeedConfig`` reads a config; ``map_pytorch_optim_to_deepspeed`` swaps a torch optimizer for
DeepSpeed's CPU one under optimizer offload. DeepSpeed itself is imported only inside functions.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import torch

from accel_state.imports import is_deepspeed_available
from accel_state.install_hints import install_hint
from accel_train.optimizer import AcceleratedOptimizer
from accel_train.scheduler import AcceleratedScheduler, StandInScheduler
from accel_train.strategies.deepspeed.config import get_value, load_config

__all__ = [
    "DeepSpeedEngineWrapper",
    "DeepSpeedOptimizerWrapper",
    "DeepSpeedSchedulerWrapper",
    "DummyOptim",
    "DummyScheduler",
    "HfDeepSpeedConfig",
    "deepspeed_required",
    "get_active_deepspeed_plugin",
    "import_deepspeed",
    "map_pytorch_optim_to_deepspeed",
]

_INSTALL = f"DeepSpeed is not installed; install the extra: {install_hint('accel-train', 'deepspeed')}"

F = TypeVar("F", bound=Callable[..., Any])


def import_deepspeed() -> Any:
    """The ``deepspeed`` module; an ImportError naming the extra when it is missing."""
    if not is_deepspeed_available():
        raise ImportError(_INSTALL)
    import deepspeed

    return deepspeed


def deepspeed_required(func: F) -> F:
    """Decorator: calling ``func`` without DeepSpeed installed raises an ImportError naming the extra.

    Args:
        func: The function to guard.
    """

    @functools.wraps(func)
    def checked(*args: Any, **kwargs: Any) -> Any:
        if not is_deepspeed_available():
            raise ImportError(f"{func.__qualname__} needs DeepSpeed. {_INSTALL}")
        return func(*args, **kwargs)

    return checked  # type: ignore[return-value]


def get_active_deepspeed_plugin(state: Any) -> Any:
    """The DeepSpeed plugin in use (the selected one when several were given) of ``state``.

    Args:
        state: The ``AcceleratorState`` (or ``Accelerator.state``) to read the plugin from.

    Raises:
        ValueError: The run does not use DeepSpeed.
    """
    from accel_state.enums import DistributedType

    if getattr(state, "distributed_type", None) != DistributedType.DEEPSPEED or not state.deepspeed_plugins:
        raise ValueError(
            "no DeepSpeed plugin is active: create the Accelerator with `deepspeed_plugin=` / "
            "`deepspeed_plugins=`, or launch with `accel launch --use_deepspeed`"
        )
    return state.deepspeed_plugin


# -- the config -----------------------------------------------------------------------------------


class HfDeepSpeedConfig:
    """A DeepSpeed config (a JSON path, a JSON string or a dict) and questions about it.

    ``config`` is the dict DeepSpeed receives; keys are addressed with dotted paths.

    Args:
        config_file_or_dict: The config: a JSON file path, a JSON string or a dict.
    """

    def __init__(self, config_file_or_dict: Any) -> None:
        self.config: dict[str, Any] = load_config(config_file_or_dict)
        self.set_stage_and_offload()

    def set_stage_and_offload(self) -> None:
        """Read the ZeRO stage and offload of `config` into `is_zero3()` / `is_offload()`.

        Called when built and again once its ``"auto"`` values are filled (a stage given as ``"auto"``
        is known only then); the answers are not read from the dict on every question.
        """
        stage = self.get_value("zero_optimization.stage", -1)
        self._stage = stage if isinstance(stage, int) and not isinstance(stage, bool) else -1
        self._offload = False
        if self.is_zero2() or self.is_zero3():
            devices = {"cpu", "nvme"}
            optimizer = self.get_value("zero_optimization.offload_optimizer.device")
            param = self.get_value("zero_optimization.offload_param.device")
            self._offload = optimizer in devices or (self.is_zero3() and param in devices)

    def find_config_node(self, ds_key_long: str) -> tuple[dict[str, Any] | None, str]:
        """The section holding the last part of dotted ``ds_key_long`` (``None`` when missing) and that part.

        Args:
            ds_key_long: Dotted path of the key, e.g. `zero_optimization.stage`.
        """
        *parents, last = ds_key_long.split(".")
        node: Any = self.config
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
            if node is None:
                return None, last
        return node, last

    def get_value(self, ds_key_long: str, default: Any = None) -> Any:
        """The value at dotted ``ds_key_long`` (``default`` when absent).

        Args:
            ds_key_long: Dotted path of the key, e.g. `zero_optimization.stage`.
            default: Value returned when the key is absent. Defaults to `None`.
        """
        return get_value(self.config, ds_key_long, default)

    def del_config_sub_tree(self, ds_key_long: str, must_exist: bool = False) -> None:
        """Remove dotted ``ds_key_long``; with ``must_exist``, a missing key is an error.

        Args:
            ds_key_long: Dotted path of the key, e.g. `zero_optimization.stage`.
            must_exist: Whether a missing key raises instead of being ignored. Defaults to `False`.

        Raises:
            ValueError: The key is missing and ``must_exist`` is `True`.
        """
        node, last = self.find_config_node(ds_key_long)
        if node is None or last not in node:
            if must_exist:
                raise ValueError(f"cannot delete {ds_key_long!r}: it is not in the DeepSpeed config")
            return
        del node[last]

    def is_true(self, ds_key_long: str) -> bool:
        """True when the key is set to true (absent: False).

        Args:
            ds_key_long: Dotted path of the key, e.g. `zero_optimization.stage`.
        """
        value = self.get_value(ds_key_long)
        return value is True or (isinstance(value, str) and value.lower() == "true")

    def is_false(self, ds_key_long: str) -> bool:
        """True when the key is set to false (absent: False).

        Args:
            ds_key_long: Dotted path of the key, e.g. `zero_optimization.stage`.
        """
        value = self.get_value(ds_key_long)
        return value is False or (isinstance(value, str) and value.lower() == "false")

    def is_auto(self, ds_key_long: str) -> bool:
        """True when the value at dotted ``ds_key_long`` is still ``"auto"``.

        Args:
            ds_key_long: Dotted path of the key, e.g. `zero_optimization.stage`.
        """
        return self.get_value(ds_key_long) == "auto"

    def is_zero2(self) -> bool:
        """True when the config's ZeRO stage is 2."""
        return self._stage == 2

    def is_zero3(self) -> bool:
        """True when the config's ZeRO stage is 3."""
        return self._stage == 3

    def is_offload(self) -> bool:
        """True when ZeRO 2/3 offloads the optimizer (or, with ZeRO 3, the parameters) to CPU or NVMe."""
        return self._offload


# -- stand-ins for what the config defines ---------------------------------------------------------


class DummyOptim(torch.optim.Optimizer):
    """Stands for the optimizer defined in the DeepSpeed config: ``prepare`` builds the real one.

    Args:
        params: the parameters (or parameter groups) to optimize.
        lr: learning rate, used where the config says ``"auto"``.
        weight_decay: weight decay, used where the config says ``"auto"``.
        **kwargs: other hyper-parameters, kept in `kwargs`.
    """

    def __init__(self, params: Iterable[Any], lr: float = 0.001, weight_decay: float = 0, **kwargs: Any) -> None:
        self.params = list(params)
        self.lr = lr
        self.weight_decay = weight_decay
        self.kwargs = kwargs
        super().__init__(self.params, {"lr": lr, "weight_decay": weight_decay})

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        """Not available: ``prepare`` replaces this stand-in with the optimizer of the DeepSpeed config.

        Args:
            closure: Accepted for the ``torch.optim.Optimizer`` signature; unused. Defaults to `None`.

        Raises:
            RuntimeError: Always.
        """
        raise RuntimeError(
            "DummyOptim only stands for the optimizer of the DeepSpeed config; pass it to "
            "`accelerator.prepare` and step the optimizer it returns"
        )


class DummyScheduler(StandInScheduler):
    """Stands for the scheduler defined in the DeepSpeed config (or built by ``lr_scheduler_callable``).

    Args:
        optimizer: the (dummy) optimizer it schedules.
        total_num_steps: total training steps, used where the config says ``"auto"``.
        warmup_num_steps: warm-up steps, used where the config says ``"auto"``.
        lr_scheduler_callable: ``callable(optimizer) -> scheduler`` building the scheduler instead of the config.
        **kwargs: other arguments, kept in `kwargs`.
    """

    replaced_by = "the scheduler of the DeepSpeed config"

    def __init__(
        self,
        optimizer: Any,
        total_num_steps: int | None = None,
        warmup_num_steps: int = 0,
        lr_scheduler_callable: Callable[[Any], Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(optimizer, total_num_steps, warmup_num_steps, **kwargs)
        self.lr_scheduler_callable = lr_scheduler_callable


# -- what prepare returns ---------------------------------------------------------------------------


class DeepSpeedEngineWrapper:
    """Runs backward through a DeepSpeed engine and steps it at accumulation boundaries.

    ``engine.step`` clips gradients, steps the optimizer and the config's scheduler, zeroes
    gradients and checks fp16 overflow.

    Args:
        engine: The ``deepspeed.DeepSpeedEngine`` built by ``prepare``.
    """

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def backward(self, loss: torch.Tensor, sync_gradients: bool = True, **kwargs: Any) -> None:
        """Backward of ``loss`` (the engine divides it by its accumulation steps); step when ``sync_gradients``.

        Args:
            loss: The loss to back-propagate.
            sync_gradients: Whether this is an accumulation boundary, where the engine steps. Defaults to `True`.
            **kwargs: Passed on to ``engine.backward``.
        """
        self.engine.set_gradient_accumulation_boundary(is_boundary=sync_gradients)
        self.engine.backward(loss, **kwargs)
        if sync_gradients:
            self.engine.step()

    def get_global_grad_norm(self) -> float | None:
        """The gradient norm the engine computed at its last step (``None`` before the first)."""
        norm = self.engine.get_global_grad_norm()
        if isinstance(norm, torch.Tensor):
            norm = norm.item()
        return norm


class DeepSpeedOptimizerWrapper(AcceleratedOptimizer):
    """The prepared optimizer of a DeepSpeed engine: the engine steps and zeroes it.

    Args:
        optimizer: The engine's optimizer.
    """

    def __init__(self, optimizer: Any) -> None:
        super().__init__(optimizer, device_placement=False, scaler=None)
        self._reports_overflow = hasattr(optimizer, "overflow")

    def zero_grad(self, set_to_none: bool | None = None) -> None:
        """Nothing: the engine zeroes gradients at its step (under `accel verify --resume-at`, the end of a
        step, where the recorder may save).

        Args:
            set_to_none: Accepted for the optimizer signature; unused. Defaults to `None`.
        """
        if self._verify_hook is not None:
            self._verify_hook.on_zero_grad()

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        """Nothing: ``accelerator.backward`` steps the engine at accumulation boundaries. Under
        `accel verify` the boundary is still counted here, where the script steps.

        Args:
            closure: Accepted for the optimizer signature; unused. Defaults to `None`.
        """
        hook = self._verify_hook
        if hook is not None and self.gradient_state.sync_gradients:
            hook.before_step(self)
            hook.after_step(self)

    @property
    def step_was_skipped(self) -> bool:
        """True when the engine skipped its last update because fp16 gradients overflowed."""
        return bool(getattr(self.optimizer, "overflow", False)) if self._reports_overflow else False

    def __repr__(self) -> str:
        return f"DeepSpeedOptimizerWrapper({type(self.optimizer).__name__})"


class DeepSpeedSchedulerWrapper(AcceleratedScheduler):
    """The prepared scheduler that a DeepSpeed engine steps together with its optimizer.

    Args:
        scheduler: The learning-rate scheduler the engine steps.
        optimizers: The prepared optimizer(s) the scheduler belongs to.
    """

    def __init__(self, scheduler: Any, optimizers: Any) -> None:
        super().__init__(scheduler, optimizers)

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Nothing: the engine steps this scheduler after each real optimizer step.

        Args:
            *args: Accepted for the scheduler signature; unused.
            **kwargs: Accepted for the scheduler signature; unused.
        """


def map_pytorch_optim_to_deepspeed(optimizer: torch.optim.Optimizer) -> Any:
    """DeepSpeed's CPU optimizer with ``optimizer``'s parameter groups and hyper-parameters.

    Adam / AdamW become ``DeepSpeedCPUAdam`` (AdamW in decoupled-weight-decay mode), Adagrad
    ``DeepSpeedCPUAdagrad``, bitsandbytes Lion ``DeepSpeedCPULion``; any other optimizer is returned
    as is. Used under ZeRO optimizer offload, where DeepSpeed wants its own CPU optimizers.

    Args:
        optimizer: The torch (or bitsandbytes) optimizer to replace.
    """
    defaults = optimizer.defaults
    kwargs: dict[str, Any] = {key: defaults[key] for key in ("lr", "weight_decay") if key in defaults}
    name = type(optimizer).__name__
    if isinstance(optimizer, torch.optim.Adagrad):
        from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad

        if "eps" in defaults:
            kwargs["eps"] = defaults["eps"]
        return DeepSpeedCPUAdagrad(optimizer.param_groups, **kwargs)
    if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        for key in ("betas", "eps", "amsgrad"):
            if key in defaults:
                kwargs[key] = defaults[key]
        kwargs["adamw_mode"] = isinstance(optimizer, torch.optim.AdamW)
        return DeepSpeedCPUAdam(optimizer.param_groups, **kwargs)
    if (
        name in ("Lion", "Lion32bit", "Lion8bit", "PagedLion", "PagedLion32bit")
        and "bitsandbytes" in type(optimizer).__module__
    ):
        from deepspeed.ops.lion import DeepSpeedCPULion

        if "betas" in defaults:
            kwargs["betas"] = defaults["betas"]
        return DeepSpeedCPULion(optimizer.param_groups, **kwargs)
    return optimizer


# The documented home of these names is ``accel_train.deepspeed_utils`` (an alias of this very module, see
# ``accel_train.MOVED_MODULES``): that is where introspection and pickles find them.
for _name in __all__:
    globals()[_name].__module__ = "accel_train.deepspeed_utils"
del _name
