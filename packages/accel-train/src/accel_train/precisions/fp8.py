"""FP8 training (``mixed_precision="fp8"``): FP8 layers from accel-quant plus bf16 autocast for the rest.

The backend is chosen by accel-quant (`accel_quant.fp8.backend.choose_fp8_backend()`): the recipe
kwargs handler given (``AORecipeKwargs`` -> torchao, ``TERecipeKwargs`` -> TransformerEngine,
``MSAMPRecipeKwargs`` -> MS-AMP, ``FP8RecipeKwargs(backend=...)``), else ``ACCELERATE_FP8_BACKEND``, else
the first installed of MS-AMP, TransformerEngine, torchao.

* torchao: Linear layers become ``Float8Linear`` (first, last and float8-incompatible ones kept, as
  accel-quant logs).
* TransformerEngine (CUDA only): Linear / LayerNorm become TE layers and the forward runs under TE's
  FP8 autocast.
* Either conversion may put new parameter objects in the model; an optimizer built before
  ``prepare`` is pointed at them before its first step.
* MS-AMP needs the model and its optimizer cast together (``msamp.initialize``); the strategies have
  no joint hook for that yet, so it is refused with a named error.

Runs with the single-device, DDP and ND-parallel (FSDP2) strategies; under FSDP2 torchao all-gathers
weights in float8 (``enable_fsdp_float8_all_gather``) and the next scales are computed after each
optimizer step. Under DeepSpeed (ZeRO 0-3) `EngineFP8Precision` serves: torchao layers, with the
engine running the rest in bf16 (its ``bf16`` section) instead of autocast; TransformerEngine and MS-AMP
are refused there by name. FSDP1 is refused by name.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any, ClassVar

import torch

from accel_train.kwargs_handlers import AutocastKwargs, GradScalerKwargs
from accel_train.precisions.base import Precision, ScalerFactory, wrap_forward

__all__ = ["EngineFP8Precision", "FP8Precision"]

_RECIPE_SLOTS = {"ao_recipe_handler": "AO", "te_recipe_handler": "TE", "msamp_recipe_handler": "MSAMP"}


class FP8Precision(Precision):
    """FP8 layers (torchao or TransformerEngine) and bf16 autocast around them."""

    modes: ClassVar[tuple[str, ...]] = ("fp8",)

    def __init__(
        self,
        mode: str,
        device: torch.device,
        autocast_kwargs: AutocastKwargs | None = None,
        scaler_kwargs: GradScalerKwargs | None = None,
        scaler_factory: ScalerFactory | None = None,
        handlers: dict[str, Any] | None = None,
    ) -> None:
        if mode != "fp8":
            raise ValueError(f"FP8Precision serves mixed_precision='fp8', not {mode!r}")
        super().__init__(mode, device, autocast_kwargs, scaler_kwargs, scaler_factory, handlers)
        from accel_quant.fp8.backend import choose_fp8_backend

        given = [slot for slot in _RECIPE_SLOTS if self.handlers.get(slot) is not None]
        umbrella = self.handlers.get("fp8_recipe_handler")
        if len(given) + (umbrella is not None) > 1:
            raise ValueError(
                f"several FP8 recipes were given ({', '.join(given + (['fp8_recipe_handler'] if umbrella else []))}); "
                "pass one of AORecipeKwargs, TERecipeKwargs, MSAMPRecipeKwargs or FP8RecipeKwargs"
            )
        explicit = _RECIPE_SLOTS[given[0]] if given else getattr(umbrella, "backend", None)
        self._backend = choose_fp8_backend(explicit)
        backend = str(self._backend)
        if backend == "MSAMP":
            raise NotImplementedError(
                "mixed_precision='fp8' with MS-AMP needs the model and optimizer cast together by msamp.initialize "
                "(accel_quant.fp8.msamp.msamp_initialize); accel-train's strategies have no hook for that yet. "
                "Use the torchao backend (AORecipeKwargs) or TransformerEngine (TERecipeKwargs)."
            )
        if backend == "TE" and self.device_type != "cuda":
            raise ValueError(
                f"TransformerEngine FP8 runs on CUDA GPUs only, but this run is on {self.device_type}; use the "
                "torchao backend (AORecipeKwargs), which also runs elsewhere (emulated without FP8 hardware)."
            )
        self._recipe: Any = self._build_recipe(backend, given, umbrella)
        kwargs = self.autocast_kwargs.to_kwargs() if self.autocast_kwargs is not None else {}
        self._autocast_enabled = kwargs.pop("enabled", True)
        self._autocast_extra = kwargs
        self._parameter_map: dict[int, torch.nn.Parameter] = {}
        self._ao_models: list[weakref.ref[torch.nn.Module]] = []
        self._ao_config: Any = None

    def _build_recipe(self, backend: str, given: list[str], umbrella: Any) -> Any:
        if backend == "AO":
            from accel_quant.fp8.recipes import AORecipe

            handler = self.handlers.get("ao_recipe_handler")
            if handler is None:
                return AORecipe()
            return AORecipe(
                config=handler.config,
                module_filter_func=handler.module_filter_func,
                pad_inner_dim=True if handler.pad_inner_dim is None else bool(handler.pad_inner_dim),
                enable_fsdp_float8_all_gather=(
                    True
                    if handler.enable_fsdp_float8_all_gather is None
                    else bool(handler.enable_fsdp_float8_all_gather)
                ),
            )
        from accel_quant.fp8.transformer_engine import te_recipe_kwargs

        handler = self.handlers.get("te_recipe_handler") or umbrella
        te_recipe_kwargs(handler)  # validates now, before any model is touched
        return handler

    # -- facts ----------------------------------------------------------------------------------------

    @property
    def dtype(self) -> torch.dtype:
        """bf16: the compute dtype of the operations that do not run in FP8."""
        return torch.bfloat16

    @property
    def fp8_backend(self) -> str:
        return str(self._backend)

    def mixed_precision_dtypes(self) -> tuple[torch.dtype | None, torch.dtype | None, torch.dtype | None]:
        return (torch.bfloat16, torch.bfloat16, torch.bfloat16)

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        return torch.autocast(
            device_type=self.device_type, dtype=torch.bfloat16, enabled=self._autocast_enabled, **self._autocast_extra
        )

    def forward_context(self, handler: AutocastKwargs | None = None) -> contextlib.AbstractContextManager[Any]:
        if handler is None:
            return self._autocast()
        kwargs = handler.to_kwargs()
        enabled = kwargs.pop("enabled", True)
        return torch.autocast(device_type=self.device_type, dtype=torch.bfloat16, enabled=enabled, **kwargs)

    # -- model ----------------------------------------------------------------------------------------

    def convert_module(self, model: torch.nn.Module) -> torch.nn.Module:
        """Swap in the backend's FP8 layers (once) and run the forward under bf16 autocast."""
        before = dict(model.named_parameters())
        if self.fp8_backend == "AO":
            from accel_quant.fp8.ao import build_ao_config, convert_model_to_fp8_ao, has_ao_layers

            if self._ao_config is None:
                self._ao_config = build_ao_config(self._recipe)
            if not has_ao_layers(model):
                convert_model_to_fp8_ao(
                    model, config=self._ao_config, module_filter_func=self._recipe.module_filter_func
                )
            self._ao_models.append(weakref.ref(model))
        else:
            from accel_quant.fp8.transformer_engine import (
                apply_fp8_autowrap,
                convert_model,
                has_transformer_engine_layers,
            )

            if not has_transformer_engine_layers(model):
                with torch.no_grad():
                    convert_model(model)
            apply_fp8_autowrap(model, self._recipe)
        # conversions may put new parameter objects in place (TE layers; torchao's float8 all-gather
        # weights): optimizers built before prepare() are pointed at them before their first step
        after = dict(model.named_parameters())
        self._parameter_map.update(
            {id(p): after[name] for name, p in before.items() if name in after and after[name] is not p}
        )
        wrap_forward(model, self._autocast)
        return model

    # -- step -----------------------------------------------------------------------------------------

    def optimizer_step(self, optimizer: torch.optim.Optimizer, closure: Any = None) -> tuple[Any, bool]:
        if self._parameter_map:
            _point_optimizer_at(optimizer, self._parameter_map)
        result = super().optimizer_step(optimizer, closure)
        if self._ao_models:
            self._precompute_fsdp_scales()
        return result

    def _precompute_fsdp_scales(self) -> None:
        """Under FSDP2 with float8 all-gather, compute the next step's weight scales in one collective."""
        from accel_quant.fp8.ao import precompute_float8_scales_for_fsdp

        config = self._ao_config
        if not getattr(config, "enable_fsdp_float8_all_gather", False):
            return
        from torch.distributed.tensor import DTensor

        for ref in self._ao_models:
            model = ref()
            if model is not None and any(isinstance(p, DTensor) for p in model.parameters()):
                precompute_float8_scales_for_fsdp(model, config)

    def __repr__(self) -> str:
        return f"FP8Precision(backend={self.fp8_backend!r}, device_type={self.device_type!r})"


def _point_optimizer_at(optimizer: torch.optim.Optimizer, mapping: dict[int, torch.nn.Parameter]) -> None:
    """Replace parameters an FP8 conversion swapped out, in the optimizer's groups and state."""
    for group in optimizer.param_groups:
        for index, param in enumerate(group["params"]):
            new = mapping.get(id(param))
            if new is not None:
                group["params"][index] = new
                if param in optimizer.state:
                    optimizer.state[new] = optimizer.state.pop(param)


class EngineFP8Precision(FP8Precision):
    """FP8 under DeepSpeed: torchao ``Float8Linear`` layers put in before ``deepspeed.initialize``; the
    engine casts the model to bf16 and scales nothing (its ``bf16`` section), so there is no autocast here.

    torchao only: TransformerEngine and MS-AMP need hooks into DeepSpeed's engine that accel does not
    have, and torchao's float8 all-gather is an FSDP2 feature (off here; asking for it is an error).
    """

    def __init__(
        self,
        mode: str,
        device: torch.device,
        autocast_kwargs: AutocastKwargs | None = None,
        scaler_kwargs: GradScalerKwargs | None = None,
        scaler_factory: ScalerFactory | None = None,
        handlers: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(mode, device, autocast_kwargs, scaler_kwargs, scaler_factory, handlers)
        if self.fp8_backend != "AO":
            raise ValueError(
                f"mixed_precision='fp8' under DeepSpeed runs with the torchao backend (AORecipeKwargs), not "
                f"{self.fp8_backend}: accel does not wire TransformerEngine or MS-AMP into DeepSpeed's engine. "
                "Pass kwargs_handlers=[AORecipeKwargs()] (or --fp8_backend ao)"
            )
        if getattr(self._recipe.config, "enable_fsdp_float8_all_gather", False):
            raise ValueError(
                "Float8LinearConfig(enable_fsdp_float8_all_gather=True) asks torchao to all-gather FSDP2 shards in "
                "float8; DeepSpeed partitions parameters itself, and torchao's float8 weight wrapper cannot be "
                "moved by the engine. Build the Float8LinearConfig without it under DeepSpeed"
            )
        # AORecipeKwargs' flag (on by default) is an FSDP2 setting: it has no meaning under DeepSpeed
        self._recipe.enable_fsdp_float8_all_gather = False

    @property
    def native_amp(self) -> bool:
        return False

    def forward_context(self, handler: AutocastKwargs | None = None) -> contextlib.AbstractContextManager[Any]:
        """Nothing: the engine's bf16 section sets the dtype of what does not run in FP8."""
        return contextlib.nullcontext()

    def convert_module(self, model: torch.nn.Module) -> torch.nn.Module:
        """Swap in torchao's FP8 layers (once); the forward is left as it is (the engine casts).

        Args:
            model: The model, converted in place.
        """
        from accel_quant.fp8.ao import build_ao_config, convert_model_to_fp8_ao, has_ao_layers

        before = dict(model.named_parameters())
        if self._ao_config is None:
            self._ao_config = build_ao_config(self._recipe)
        if not has_ao_layers(model):
            convert_model_to_fp8_ao(model, config=self._ao_config, module_filter_func=self._recipe.module_filter_func)
        after = dict(model.named_parameters())
        self._parameter_map.update(
            {id(p): after[name] for name, p in before.items() if name in after and after[name] is not p}
        )
        return model

    def point_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Point an optimizer built before the conversion at the parameters now in the model.

        Args:
            optimizer: The torch optimizer handed to the engine.
        """
        if self._parameter_map:
            _point_optimizer_at(optimizer, self._parameter_map)
