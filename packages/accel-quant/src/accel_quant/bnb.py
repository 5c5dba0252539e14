"""bitsandbytes quantization: swap Linear layers for 8-bit or 4-bit ones and load checkpoints into them.

The documented entry point is `load_and_quantize_model()`: from an empty (meta) model and a
checkpoint, or from a model already in memory. Quantization itself is bitsandbytes': its parameter
classes quantize when moved to a device (``Int8Params`` / ``Params4bit`` ``.to(device)``), on CPU
(bitsandbytes' CPU backend) as on GPU. bitsandbytes is imported only inside the functions.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from accel_bigmodel.big_modeling import DEVICE_MAP_STRATEGIES, dispatch_model
from accel_bigmodel.checkpoint import describe, resolve_checkpoint
from accel_bigmodel.empty import init_empty_weights
from accel_bigmodel.loading import load_checkpoint_in_model
from accel_bigmodel.offload import offload_weight
from accel_bigmodel.planning import get_balanced_memory, infer_auto_device_map
from accel_bigmodel.tied import find_tied_parameters
from accel_quant._requirements import require_bnb
from accel_quant.bnb_config import BnbQuantizationConfig
from accel_quant.bnb_offload import attach_int8_statistics_hooks
from accel_state.logging import get_logger

logger = get_logger(__name__)

__all__ = [
    "load_and_quantize_model",
    "get_quantized_model_device_map",
    "replace_with_bnb_layers",
    "get_keys_to_not_convert",
    "has_4bit_bnb_layers",
    "has_8bit_bnb_layers",
    "get_parameter_device",
    "quantize_bnb_layers",
    "name_matches",
    "quantized_model_bytes",
    "quantize_and_offload_8bit",
]


# -- names ---------------------------------------------------------------------------------------
def name_matches(module_name: str, key: str) -> bool:
    """True when ``key`` names ``module_name`` or one of its ancestors, as whole dotted segments.

    ``"lm_head"`` matches ``lm_head`` and ``model.lm_head``; ``"h.0"`` matches ``transformer.h.0.attn``;
    ``"head"`` does not match ``lm_head``.
    """
    wrapped = f".{module_name}."
    return key == module_name or f".{key}." in wrapped


def _matching(module_name: str, keys: Iterable[str]) -> bool:
    return any(name_matches(module_name, key) for key in keys)


def get_keys_to_not_convert(model: nn.Module) -> list[str]:
    """Modules to keep unquantized by default: the last top-level child (the output head) and modules tied to others.

    A base model without a head (``base_model_prefix`` set but not present as an attribute) and without
    tied weights keeps nothing back.

    Args:
        model: The model (an `nn.Module`).
    """
    tied = find_tied_parameters(model)
    tied_modules = [name.rpartition(".")[0] for group in tied for name in group]
    prefix = getattr(model, "base_model_prefix", None)
    is_base_model = isinstance(prefix, str) and bool(prefix) and not hasattr(model, prefix)
    if not tied_modules and is_base_model:
        return []
    children = [name for name, _ in model.named_children()]
    keys = list(dict.fromkeys(tied_modules))
    if children and children[-1] not in keys:
        keys.append(children[-1])
    return [k for k in keys if k]


def get_parameter_device(model: nn.Module) -> torch.device:
    """Device of the model's first parameter (CPU for a model without parameters).

    Args:
        model: The model (an `nn.Module`).
    """
    for param in model.parameters():
        return param.device
    return torch.device("cpu")


def has_4bit_bnb_layers(model: nn.Module) -> bool:
    """True when ``model`` holds a bitsandbytes 4-bit Linear layer.

    Args:
        model: The model (an `nn.Module`).
    """
    bnb = require_bnb()
    return any(isinstance(m, bnb.nn.Linear4bit) for m in model.modules())


def has_8bit_bnb_layers(model: nn.Module) -> bool:
    """True when ``model`` holds a bitsandbytes 8-bit Linear layer.

    Args:
        model: The model (an `nn.Module`).
    """
    bnb = require_bnb()
    return any(isinstance(m, bnb.nn.Linear8bitLt) for m in model.modules())


# -- layer replacement ---------------------------------------------------------------------------
def _new_layer(bnb: Any, linear: nn.Linear, config: BnbQuantizationConfig) -> nn.Module:
    """An empty (meta) bitsandbytes layer of ``linear``'s shape, configured by ``config``."""
    has_bias = linear.bias is not None
    with init_empty_weights():
        if config.load_in_8bit:
            return bnb.nn.Linear8bitLt(
                linear.in_features,
                linear.out_features,
                has_bias,
                has_fp16_weights=False,
                threshold=config.llm_int8_threshold,
            )
        return bnb.nn.Linear4bit(
            linear.in_features,
            linear.out_features,
            has_bias,
            config.bnb_4bit_compute_dtype,
            compress_statistics=config.bnb_4bit_use_double_quant,
            quant_type=config.bnb_4bit_quant_type,
            quant_storage=config.bnb_4bit_quant_storage,
        )


def _quantized_param(bnb: Any, layer: nn.Module, data: torch.Tensor) -> nn.Parameter:
    """``data`` (full precision) wrapped in the layer's bitsandbytes parameter class, not yet quantized."""
    if isinstance(layer, bnb.nn.Linear8bitLt):
        param: nn.Parameter = bnb.nn.Int8Params(data, requires_grad=False, has_fp16_weights=False)
        return param
    old: Any = layer.weight
    param = bnb.nn.Params4bit(
        data,
        requires_grad=False,
        blocksize=old.blocksize,
        compress_statistics=old.compress_statistics,
        quant_type=old.quant_type,
        quant_storage=old.quant_storage,
        module=layer,
    )
    return param


def replace_with_bnb_layers(
    model: nn.Module,
    bnb_quantization_config: BnbQuantizationConfig,
    modules_to_not_convert: list[str] | None = None,
    current_key_name: list[str] | None = None,
) -> nn.Module:
    """Swap every ``nn.Linear`` of ``model`` (in place) for a bitsandbytes 8-bit or 4-bit layer.

    Layers named in ``modules_to_not_convert`` (default: ``bnb_quantization_config.skip_modules``)
    stay as they are. A layer holding weights keeps them (full precision, quantized by
    `quantize_bnb_layers()` or when moved to a device); a meta layer stays empty. Raises
    ValueError when a name to skip matches no module of the model.

    Args:
        model: The model (an `nn.Module`).
        bnb_quantization_config: Bits, compute dtype and the modules kept in full precision.
        modules_to_not_convert: Names of modules kept as they are; `None` takes them from the config.
        current_key_name: Name path of the module being visited (used while recursing; leave `None`).
    """
    bnb = require_bnb(bnb_quantization_config.bits)
    skip = list(
        modules_to_not_convert if modules_to_not_convert is not None else bnb_quantization_config.skip_modules or []
    )
    names = [name for name, _ in model.named_modules()]
    unmatched = [key for key in skip if not any(name_matches(name, key) for name in names if name)]
    if unmatched:
        sample = ", ".join(n for n in names[1:13] if n)
        raise ValueError(
            f"Modules to keep unquantized {unmatched} match no module of {type(model).__name__}: give module "
            f"names (or their last parts) such as {sample}."
        )
    root = ".".join(current_key_name or [])
    converted = 0
    for full_name, module in list(model.named_modules()):
        if not isinstance(module, nn.Linear) or not full_name:
            continue
        qualified = f"{root}.{full_name}" if root else full_name
        if _matching(qualified, skip) or _matching(full_name, skip):
            continue
        layer = _new_layer(bnb, module, bnb_quantization_config)
        if module.weight.device.type != "meta":
            layer.weight = _quantized_param(bnb, layer, module.weight.data)
            if module.bias is not None:
                layer.bias = nn.Parameter(module.bias.data, requires_grad=False)
        layer.requires_grad_(False)
        parent_name, _, child = full_name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, layer)
        converted += 1
    if converted == 0:
        logger.warning(
            "No Linear layer of %s was converted to bitsandbytes (all skipped or none present).", type(model).__name__
        )
    return model


def _int8_weight(bnb: Any, data: torch.Tensor, device: torch.device) -> nn.Parameter:
    """``data`` quantized row-wise to int8 on ``device``, as an ``Int8Params`` holding its statistics.

    ``Int8Params.to(device)`` quantizes only when the data comes from the CPU; a weight that was loaded
    straight onto a GPU would stay full precision. Quantizing with bitsandbytes' own row-wise function
    where the weight lives gives the same bytes as that move would, on any device.
    """
    rows = data.to(device=device, dtype=torch.float16).contiguous()
    int8, scales, _outliers = bnb.functional.int8_vectorwise_quant(rows)
    param: Any = bnb.nn.Int8Params(int8, requires_grad=False, has_fp16_weights=False)
    param.CB, param.SCB = int8, scales
    return param  # type: ignore[no-any-return]


def quantize_bnb_layers(model: nn.Module, device: torch.device | str | None = None) -> nn.Module:
    """Quantize the bitsandbytes layers of ``model`` whose weights are loaded but still full precision.

    Each weight is quantized where it lies (or on ``device``); meta (offloaded) weights are left alone.
    Weights already quantized (int8 with statistics, packed 4-bit) are kept.

    Args:
        model: The model (an `nn.Module`).
        device: Where the quantization runs; `None` quantizes each weight where it lies.
    """
    bnb = require_bnb()
    for module in model.modules():
        if not isinstance(module, bnb.nn.Linear8bitLt | bnb.nn.Linear4bit):
            continue
        weight = module.weight
        if weight.device.type == "meta" or not weight.is_floating_point():
            continue
        target = torch.device(device) if device is not None else weight.device
        if isinstance(module, bnb.nn.Linear8bitLt):
            module.weight = _int8_weight(bnb, weight.data, target)
        else:
            module.weight = _quantized_param(bnb, module, weight.data).to(target)
        if module.bias is not None and module.bias.device != target:
            module.bias = nn.Parameter(module.bias.data.to(target), requires_grad=False)
    return model


# -- device maps ---------------------------------------------------------------------------------
def _offload_devices(device_map: Mapping[str, Any]) -> set[str]:
    """Devices that hold weights away from where they run: "disk", and "cpu" when an accelerator is used."""
    values = {str(v) for v in device_map.values()}
    accelerated = any(v not in ("cpu", "disk") for v in values)
    return {"cpu", "disk"} if accelerated else {"disk"}


def _default_device() -> torch.device | str | int:
    return torch.cuda.current_device() if torch.cuda.is_available() else "cpu"


def get_quantized_model_device_map(
    model: nn.Module,
    bnb_quantization_config: BnbQuantizationConfig,
    device_map: str | Mapping[str, Any] | None = None,
    max_memory: Mapping[Any, int | str] | None = None,
    no_split_module_classes: list[str] | None = None,
) -> dict[str, Any]:
    """The device map for a model whose Linear layers were replaced: planned with quantized sizes.

    None puts everything on the current accelerator (the CPU without one); a strategy name
    (``auto``, ``balanced``, ``balanced_low_0``, ``sequential``) is planned with the layers' int8 /
    int4 sizes. A 4-bit layer may not be offloaded (to CPU next to an accelerator, or to disk).

    Args:
        model: The model, with its Linear layers already replaced.
        bnb_quantization_config: The quantization settings (bits, dtypes, modules kept in full precision).
        device_map: A device map, `auto` / `balanced` / `balanced_low_0` / `sequential`, or `None` for the
            current device.
        max_memory: Device -> memory budget (bytes or a string such as `"10GiB"`) for the automatic maps.
        no_split_module_classes: Class names of modules that must stay on one device.
    """
    config = bnb_quantization_config
    keep = list(config.skip_modules or []) + list(config.keep_in_fp32_modules or [])
    if device_map is None:
        device_map = {"": _default_device()}
        logger.info("No device_map given: the quantized model goes on %s.", device_map[""])
    if isinstance(device_map, str):
        if device_map not in DEVICE_MAP_STRATEGIES:
            raise ValueError(
                f"device_map {device_map!r} is not a strategy: use one of {DEVICE_MAP_STRATEGIES} or a dict."
            )
        special: dict[str, Any] = {}
        for name, _ in model.named_parameters():
            owner = name.rpartition(".")[0]
            if _matching(owner, config.keep_in_fp32_modules or []):
                special[name] = torch.float32
            elif _matching(owner, config.skip_modules or []) and config.torch_dtype is not None:
                special[name] = config.torch_dtype
        plan_kwargs: dict[str, Any] = {
            "special_dtypes": special,
            "no_split_module_classes": no_split_module_classes,
            "dtype": config.target_dtype,
        }
        if device_map != "sequential":
            max_memory = get_balanced_memory(
                model, max_memory=max_memory, low_zero=device_map == "balanced_low_0", **plan_kwargs
            )
        device_map = infer_auto_device_map(model, max_memory=max_memory, **plan_kwargs)
    device_map = dict(device_map)  # type: ignore[arg-type]
    offloaded = _offload_devices(device_map)
    quantized_offloaded = [
        name for name, dev in device_map.items() if str(dev) in offloaded and not _matching(name, keep)
    ]
    if quantized_offloaded and config.load_in_4bit:
        raise ValueError(
            f"Modules {quantized_offloaded[:5]} would be offloaded (CPU/disk) in 4-bit, which is not supported: "
            "give more memory to the accelerators, or pass a device_map dict so that offloaded modules stay in "
            "torch_dtype unquantized."
        )
    if quantized_offloaded:
        logger.info("Modules %s are offloaded; their Linear layers are offloaded in 8-bit.", quantized_offloaded[:5])
    return device_map


# -- loading -------------------------------------------------------------------------------------
def quantize_and_offload_8bit(
    model: nn.Module,
    param: torch.Tensor,
    param_name: str,
    new_dtype: torch.dtype | None,
    offload_folder: str | os.PathLike[str],
    offload_index: dict[str, Any],
    fp16_statistics: torch.Tensor | None = None,
) -> None:
    """Offload the 8-bit weight ``param_name`` of ``model`` to ``offload_folder`` as int8 plus its row scales.

    A full-precision ``param`` is quantized on the CPU first; an int8 ``param`` is written as is with
    ``fp16_statistics`` as its scales. The model keeps a meta placeholder; ``offload_index`` gains both entries.
    """
    bnb = require_bnb(8)
    module_name, _, _ = param_name.rpartition(".")
    scb_name = f"{module_name}.SCB" if module_name else "SCB"
    if fp16_statistics is None:
        if not param.is_floating_point():
            raise ValueError(f"{param_name} is already int8: give its row scales as fp16_statistics.")
        source = param.to(new_dtype) if new_dtype is not None else param
        quantized = bnb.nn.Int8Params(source.detach().to("cpu"), requires_grad=False, has_fp16_weights=False).to("cpu")
        data, scales = quantized.data, quantized.SCB
    else:
        data, scales = param.detach().to("cpu"), fp16_statistics.detach().to("cpu")
    offload_weight(data, param_name, os.fspath(offload_folder), index=offload_index)
    offload_weight(scales, scb_name, os.fspath(offload_folder), index=offload_index)
    owner = model.get_submodule(module_name) if module_name else model
    attr = param_name.rpartition(".")[2]
    old = owner._parameters[attr]
    owner._parameters[attr] = (
        bnb.nn.Int8Params(torch.empty(tuple(param.shape), device="meta"), requires_grad=False, has_fp16_weights=False)
        if old is None or type(old).__name__ == "Int8Params"
        else nn.Parameter(torch.empty(tuple(param.shape), device="meta"), requires_grad=False)
    )


def _checkpoint_keys(weights_location: str | os.PathLike[str]) -> set[str]:
    files = resolve_checkpoint(weights_location)
    if files.key_to_file is not None:
        return set(files.key_to_file)
    found, _ = describe(files.files)
    return set(found)


def _prepare_prequantized_8bit(bnb: Any, model: nn.Module, keys: set[str]) -> list[nn.Module]:
    """Give 8-bit layers whose checkpoint is already int8 buffers for ``SCB`` / ``weight_format``.

    The checkpoint then matches the model name for name and the statistics load with the weights.
    """
    prepared = []
    for name, module in model.named_modules():
        prefix = f"{name}." if name else ""
        if isinstance(module, bnb.nn.Linear8bitLt) and f"{prefix}SCB" in keys:
            device = module.weight.device
            module.register_buffer("SCB", torch.empty(module.out_features, dtype=torch.float32, device=device))
            module.register_buffer("weight_format", torch.zeros((), dtype=torch.uint8, device=device))
            prepared.append(module)
    return prepared


def _finish_prequantized_8bit(modules: list[nn.Module]) -> None:
    """Move the loaded statistics from the helper buffers into each weight; drop the buffers."""
    for module in modules:
        scb: Any = module._buffers.pop("SCB")
        fmt: Any = module._buffers.pop("weight_format")
        if fmt is not None and fmt.device.type != "meta" and int(fmt.item()) != 0:
            raise ValueError(f"8-bit checkpoint weight format {int(fmt.item())} is not supported (only row-major, 0).")
        weight: Any = module.weight
        if weight.device.type != "meta":
            weight.CB = weight.data
            weight.SCB = scb.to(weight.device)
        else:
            module._accel_int8_scb = scb  # offloaded: the statistics hook takes them from here


def _cast_unquantized(bnb: Any, model: nn.Module, config: BnbQuantizationConfig) -> None:
    """Put the floating parameters outside the quantized layers in torch_dtype (float32 for keep_in_fp32_modules)."""
    fp32 = config.keep_in_fp32_modules or []
    for name, module in model.named_modules():
        if isinstance(module, bnb.nn.Linear8bitLt | bnb.nn.Linear4bit):
            continue
        keep = _matching(name, fp32) if name else False
        dtype = torch.float32 if keep else config.torch_dtype
        if dtype is None:
            continue
        for pname, param in list(module._parameters.items()):
            if param is not None and param.is_floating_point() and param.dtype != dtype:
                module._parameters[pname] = nn.Parameter(param.data.to(dtype), requires_grad=param.requires_grad)


def load_and_quantize_model(
    model: nn.Module,
    bnb_quantization_config: BnbQuantizationConfig,
    weights_location: str | os.PathLike[str] | None = None,
    device_map: str | Mapping[str, Any] | None = None,
    no_split_module_classes: list[str] | None = None,
    max_memory: Mapping[Any, int | str] | None = None,
    offload_folder: str | os.PathLike[str] | None = None,
    offload_state_dict: bool = False,
) -> nn.Module:
    """Quantize ``model``'s Linear layers with bitsandbytes, loading ``weights_location`` into it first if it is empty.

    Args:
        model: a model created under ``init_empty_weights()`` (then ``weights_location`` is needed), or
            one already holding its weights (then it is quantized where it is).
        bnb_quantization_config: what to quantize and how.
        weights_location: a checkpoint file, folder or sharded index (full precision, or an 8-bit
            model saved by ``save_model``).
        device_map: where each module goes (a dict, ``"auto"`` / ``"balanced"`` / ``"balanced_low_0"``
            / ``"sequential"``, or None for the current accelerator, else the CPU). Modules mapped to
            "cpu" (next to an accelerator) or "disk" are offloaded: in 8-bit they are offloaded
            quantized, in 4-bit they stay unquantized in ``torch_dtype``.
        no_split_module_classes: layer classes a planned device map keeps whole.
        max_memory: memory budget per device for a planned device map.
        offload_folder: where weights mapped to "disk" go.
        offload_state_dict: keep CPU weights out of RAM while loading (default when some go to disk).

    Returns:
        the quantized model (dispatched with hooks when it spans several devices).
    """
    config = bnb_quantization_config
    if not isinstance(config, BnbQuantizationConfig):
        raise TypeError(f"bnb_quantization_config must be a BnbQuantizationConfig, got {type(config).__name__}.")
    bnb = require_bnb(config.bits)
    skip = list(config.skip_modules) if config.skip_modules is not None else get_keys_to_not_convert(model)
    fp32_modules = list(config.keep_in_fp32_modules or [])
    if isinstance(device_map, Mapping) and len(device_map) > 1 and config.load_in_4bit:
        offloaded = _offload_devices(device_map)
        skip.extend(name for name, dev in device_map.items() if str(dev) in offloaded and name not in skip)
    _warn_unused(fp32_modules, model, "keep_in_fp32_modules")
    not_converted = skip + [m for m in fp32_modules if m not in skip and _names_something(model, m)]
    # the planning and loading below see the effective lists, not the user's config object
    effective = BnbQuantizationConfig(
        load_in_8bit=config.load_in_8bit,
        load_in_4bit=config.load_in_4bit,
        llm_int8_threshold=config.llm_int8_threshold,
        bnb_4bit_quant_type=config.bnb_4bit_quant_type,
        bnb_4bit_use_double_quant=config.bnb_4bit_use_double_quant,
        bnb_4bit_compute_dtype=config.bnb_4bit_compute_dtype,
        bnb_4bit_quant_storage=config.bnb_4bit_quant_storage,
        torch_dtype=config.torch_dtype,
        skip_modules=skip,
        keep_in_fp32_modules=fp32_modules,
    )
    setattr(model, "is_loaded_in_4bit", config.load_in_4bit)  # noqa: B010  (read by peft and prepare)
    setattr(model, "is_loaded_in_8bit", config.load_in_8bit)  # noqa: B010

    if get_parameter_device(model).type != "meta":
        logger.warning(
            "Quantizing a model already in memory holds its full-precision weights at the same time: create it "
            "under init_empty_weights() and pass weights_location to load it quantized."
        )
        replace_with_bnb_layers(model, effective, modules_to_not_convert=not_converted)
        _cast_unquantized(bnb, model, effective)
        quantize_bnb_layers(model)
        if device_map is not None and not (
            isinstance(device_map, Mapping) and len(set(map(str, device_map.values()))) == 1
        ):
            planned = get_quantized_model_device_map(model, effective, device_map, max_memory, no_split_module_classes)
            model = dispatch_model(model, device_map=planned, offload_dir=offload_folder)
            attach_int8_statistics_hooks(model)
        elif isinstance(device_map, Mapping):
            target = next(iter(device_map.values()))
            model.to(torch.device("cuda", target) if isinstance(target, int) else torch.device(str(target)))
        return model

    if weights_location is None:
        raise ValueError(
            "The model is empty (on the meta device): pass weights_location=<checkpoint file or folder> to load "
            "its weights."
        )
    replace_with_bnb_layers(model, effective, modules_to_not_convert=not_converted)
    planned = get_quantized_model_device_map(model, effective, device_map, max_memory, no_split_module_classes)
    keys = _checkpoint_keys(weights_location)
    if config.load_in_4bit and any(".weight.quant_state." in key for key in keys):
        raise ValueError(
            f"{os.fspath(weights_location)!r} holds 4-bit quantized weights; loading a saved 4-bit model is not "
            "supported: load the full-precision checkpoint with load_in_4bit=True instead."
        )
    prequantized = _prepare_prequantized_8bit(bnb, model, keys) if config.load_in_8bit else []
    values = {str(v) for v in planned.values()}
    offload = bool(values & _offload_devices(planned))
    if "disk" in values and offload_folder is None:
        raise ValueError(
            "The device_map puts some modules on 'disk' but no offload_folder was given: pass offload_folder=<a folder>."
        )
    if offload_state_dict is None:
        offload_state_dict = "disk" in values
    load_checkpoint_in_model(
        model,
        weights_location,
        device_map=planned,
        dtype=config.torch_dtype,
        offload_folder=offload_folder,
        offload_state_dict=bool(offload_state_dict),
        keep_in_fp32_modules=fp32_modules,
        offload_8bit_bnb=config.load_in_8bit and offload,
    )
    _finish_prequantized_8bit(prequantized)
    quantize_bnb_layers(model)
    model = dispatch_model(model, device_map=planned, offload_dir=offload_folder)
    attach_int8_statistics_hooks(model)
    return model


def _names_something(model: nn.Module, key: str) -> bool:
    return any(name_matches(n, key) for n, _ in model.named_modules() if n)


def _warn_unused(names: list[str], model: nn.Module, what: str) -> None:
    module_names = [n for n, _ in model.named_modules() if n]
    unused = [k for k in names if not any(name_matches(n, k) for n in module_names)]
    if unused:
        warnings.warn(f"{what} {unused} match no module of {type(model).__name__}.", stacklevel=3)


def _quant_state_tensors(state: Any) -> list[torch.Tensor]:
    found = [t for t in (getattr(state, "absmax", None), getattr(state, "code", None)) if isinstance(t, torch.Tensor)]
    nested = getattr(state, "state2", None)
    if nested is not None:
        found.extend(_quant_state_tensors(nested))
    return found


def quantized_model_bytes(model: nn.Module) -> int:
    """Bytes of ``model``'s parameters and buffers, counting each quantized weight with its statistics.

    An 8-bit weight counts its int8 matrix and row scales (``SCB``); a 4-bit weight its packed bytes
    and quantization state (block scales, code book, nested scales with double quantization).
    Shared tensors count once; meta (offloaded) tensors count nothing.

    Args:
        model: The model (an `nn.Module`).
    """
    seen: set[tuple[int, int, torch.dtype]] = set()
    total = 0

    def add(tensor: torch.Tensor | None) -> None:
        nonlocal total
        if tensor is None or tensor.device.type == "meta":
            return
        key = (tensor.data_ptr() if tensor.numel() else id(tensor), tensor.numel(), tensor.dtype)
        if key in seen:
            return
        seen.add(key)
        total += tensor.numel() * tensor.element_size()

    for module in model.modules():
        for tensor in [*module._parameters.values(), *module._buffers.values()]:
            add(tensor)
        weight = module._parameters.get("weight")
        scb = getattr(weight, "SCB", None) if weight is not None else None
        state_scb = getattr(getattr(module, "state", None), "SCB", None)
        add(scb if isinstance(scb, torch.Tensor) else state_scb if isinstance(state_scb, torch.Tensor) else None)
        quant_state = getattr(weight, "quant_state", None) if weight is not None else None
        for tensor in _quant_state_tensors(quant_state) if quant_state is not None else []:
            add(tensor)
    return total
