"""Hooks around a module's forward: move inputs and weights to the execution device, offload after.

A hook is attached with `add_hook_to_module()`, which wraps ``module.forward`` (keeping the
original as ``module._old_forward`` and the hook as ``module._hf_hook``, the attribute names other
libraries look for). `AlignDevicesHook` brings offloaded weights in before the forward and
puts meta placeholders back after it; weights come from a background prefetcher when the model was
dispatched (see `accel_bigmodel.prefetch`), else straight from the weights map.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from accel_bigmodel.offload import PrefixedDataset
from accel_bigmodel.sizes import get_non_persistent_buffers, iter_module_tensors, named_module_tensors
from accel_bigmodel.tensor_io import MAP_THRESHOLD
from accel_bigmodel.tensors import set_module_tensor_to_device
from accel_state.nested import find_device, send_to_device


def _any(module: nn.Module) -> Any:
    """``module`` typed loosely: hooks add attributes (``_hf_hook``, ``_old_forward``) torch's stubs do not know."""
    return module


class ModelHook:
    """Base hook: override ``init_hook``, ``pre_forward``, ``post_forward`` and ``detach_hook`` as needed.

    ``no_grad = True`` runs the wrapped forward under ``torch.no_grad()``.
    """

    no_grad = False

    def init_hook(self, module: nn.Module) -> nn.Module:
        """Called when the hook is attached.

        Args:
            module: The module.
        """
        return module

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Called before the forward with its arguments; returns the arguments to use.

        Args:
            module: The module.
            *args: The positional inputs of the forward.
            **kwargs: The keyword inputs of the forward.
        """
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        """Called after the forward with its output; returns the output to use.

        Args:
            module: The module.
            output: The output of the forward.
        """
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        """Called when the hook is removed.

        Args:
            module: The module.
        """
        return module


class SequentialHook(ModelHook):
    """Several hooks run in order (post_forward in the same order).

    Args:
        hooks: The hooks, in the order they run.
    """

    def __init__(self, *hooks: ModelHook):
        self.hooks = hooks

    def init_hook(self, module: nn.Module) -> nn.Module:
        """Run `init_hook` of each hook in order.

        Args:
            module: The module.
        """
        for hook in self.hooks:
            module = hook.init_hook(module)
        return module

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Run `pre_forward` of each hook in order, each on the previous one's result.

        Args:
            module: The module.
            *args: The positional inputs of the forward.
            **kwargs: The keyword inputs of the forward.
        """
        for hook in self.hooks:
            args, kwargs = hook.pre_forward(module, *args, **kwargs)
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        """Run `post_forward` of each hook in order, each on the previous one's result.

        Args:
            module: The module.
            output: The output of the forward.
        """
        for hook in self.hooks:
            output = hook.post_forward(module, output)
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        """Run `detach_hook` of each hook in order.

        Args:
            module: The module.
        """
        for hook in self.hooks:
            module = hook.detach_hook(module)
        return module

    @property
    def no_grad(self) -> bool:  # type: ignore[override]
        """True when any of the hooks runs its forward without gradients."""
        return any(h.no_grad for h in self.hooks)


def _hooked_forward(module: Any, *args: Any, **kwargs: Any) -> Any:
    hook = module._hf_hook
    args, kwargs = hook.pre_forward(module, *args, **kwargs)
    if hook.no_grad:
        with torch.no_grad():
            output = module._old_forward(*args, **kwargs)
    else:
        output = module._old_forward(*args, **kwargs)
    return hook.post_forward(module, output)


def add_hook_to_module(module: nn.Module, hook: ModelHook, append: bool = False) -> nn.Module:
    """Attach ``hook`` to ``module`` (replacing any hook, or chaining after it with ``append=True``).

    Args:
        module: The module.
        hook: The hook to attach.
        append: Chain after an existing hook instead of replacing it.
    """
    mod: Any = module
    if append and getattr(mod, "_hf_hook", None) is not None:
        previous = mod._hf_hook
        remove_hook_from_module(mod)
        hook = SequentialHook(previous, hook)
    if hasattr(mod, "_hf_hook") and hasattr(mod, "_old_forward"):
        old_forward = mod._old_forward
    else:
        old_forward = mod.forward
        mod.__dict__["_old_forward"] = old_forward  # plain attributes: skip nn.Module.__setattr__'s checks
    mod = hook.init_hook(mod)
    mod.__dict__["_hf_hook"] = hook
    wrapped = functools.update_wrapper(functools.partial(_hooked_forward, mod), old_forward)
    if "GraphModuleImpl" in str(type(mod)):
        mod.__class__.forward = wrapped
    else:
        mod.__dict__["forward"] = wrapped
    return mod


def remove_hook_from_module(module: nn.Module, recurse: bool = False) -> nn.Module:
    """Detach the hook of ``module`` (and of its submodules with ``recurse``) and restore its forward.

    Args:
        module: The module.
        recurse: Also go through the submodules.
    """
    mod: Any = module
    if hasattr(mod, "_hf_hook"):
        mod._hf_hook.detach_hook(mod)
        delattr(mod, "_hf_hook")
    if hasattr(mod, "_old_forward"):
        old = mod._old_forward
        if "GraphModuleImpl" in str(type(mod)):
            mod.__class__.forward = old.__get__(mod)
        elif (
            getattr(old, "__func__", None) is getattr(type(mod), "forward", None)
            and getattr(old, "__self__", None) is mod
        ):
            mod.__dict__.pop("forward", None)
        else:
            mod.forward = old
        delattr(mod, "_old_forward")
    if recurse:
        for child in mod.children():
            remove_hook_from_module(child, recurse)
    return mod


def remove_hook_from_submodules(module: nn.Module) -> None:
    """Remove the hooks of ``module`` and every submodule.

    Args:
        module: The module.
    """
    remove_hook_from_module(module)
    for child in module.children():
        remove_hook_from_submodules(child)


def _device(device: Any) -> Any:
    if device is None or isinstance(device, torch.device):
        return device
    if isinstance(device, int):
        return torch.device("cuda", device) if torch.cuda.is_available() else torch.device(device)
    return torch.device(device)


def _send(data: Any, device: torch.device, skip_keys: Any) -> Any:
    if isinstance(data, torch.Tensor):
        return data if data.device == device else data.to(device)
    if isinstance(data, tuple) and all(isinstance(t, torch.Tensor) and t.device == device for t in data):
        return data
    if isinstance(data, dict) and not data:
        return data
    return send_to_device(data, device, skip_keys=skip_keys)


class _Slot:
    """One offloaded tensor of a hooked module: where it goes and its meta placeholder."""

    __slots__ = ("attr", "cls", "dtype", "is_param", "key", "owner", "placeholder", "requires_grad")

    def __init__(self, owner: nn.Module, attr: str, key: str, is_param: bool, current: torch.Tensor):
        self.owner, self.attr, self.key, self.is_param = owner, attr, key, is_param
        self.requires_grad = bool(getattr(current, "requires_grad", False))
        self.cls = type(current) if is_param else None
        self.dtype = current.dtype
        self.placeholder = current


class AlignDevicesHook(ModelHook):
    """Run a module on ``execution_device``: its inputs (and weights, when ``offload``) are moved there.

    With ``offload`` the weights live in ``weights_map`` (CPU tensors, or a loader reading from disk)
    and the module holds meta placeholders between forwards. ``io_same_device`` sends the output back
    to the device of the input; ``place_submodules`` covers the submodules' tensors too.

    Args:
        execution_device: The device the forward runs on (weights and inputs are brought there); `None` uses
            the model's first device / the current accelerator.
        offload: Keep the weights off the execution device, bringing them there only for the forward.
        io_same_device: Move the outputs back to the device the inputs came from.
        weights_map: Mapping name -> tensor the offloaded weights are read from (for example an
            `OffloadedWeightsLoader`).
        offload_buffers: Offload the buffers with the weights (else buffers stay on the execution device).
        place_submodules: Also place the weights of the submodules.
        skip_keys: Keys of dict inputs and outputs that are not moved between devices.
        tied_params_map: Shared cache of tied weights already moved to the execution device (data pointer ->
            device -> tensor), so a tied weight is moved once.
    """

    def __init__(
        self,
        execution_device: int | str | torch.device | None = None,
        offload: bool = False,
        io_same_device: bool = False,
        weights_map: Mapping[str, Any] | None = None,
        offload_buffers: bool = False,
        place_submodules: bool = False,
        skip_keys: str | list[str] | None = None,
        tied_params_map: dict[int, dict[Any, torch.Tensor]] | None = None,
    ):
        self.execution_device = execution_device
        self.offload = offload
        self.io_same_device = io_same_device
        self.weights_map = weights_map
        self.offload_buffers = offload_buffers
        self.place_submodules = place_submodules
        self.skip_keys = skip_keys
        self.tied_params_map = tied_params_map
        self.input_device: torch.device | None = None
        self.param_original_devices: dict[str, torch.device] = {}
        self.buffer_original_devices: dict[str, torch.device] = {}
        self.tied_params_names: set[str] = set()
        self.prefetcher: Any = None
        self.prefetch_slot: int | None = None
        self._slots: list[_Slot] = []
        self._device: torch.device | None = None
        self._plan: list[Any] | None = None
        self._plan_ready = False

    def __repr__(self) -> str:
        return (
            f"AlignDevicesHook(execution_device={self.execution_device}, offload={self.offload}, "
            f"io_same_device={self.io_same_device}, offload_buffers={self.offload_buffers}, "
            f"place_submodules={self.place_submodules}, skip_keys={self.skip_keys!r})"
        )

    def init_hook(self, module: nn.Module) -> nn.Module:
        """Place the module's weights: on the execution device, or on meta when offloaded.

        Args:
            module: The module.
        """
        self._device = _device(self.execution_device)
        if self._device is not None and self._device.type == "meta":
            self.tied_params_map = None
        recurse = self.place_submodules
        if not self.offload and self._device is not None:
            device = self._device
            for name, tensor in named_module_tensors(module, recurse=recurse):
                if tensor.device != device:
                    set_module_tensor_to_device(module, name, device, tied_params_map=self.tied_params_map)
            return module
        if not self.offload:
            return module
        self.param_original_devices = {n: p.device for n, p in module.named_parameters(recurse=recurse)}
        self.buffer_original_devices = {n: b.device for n, b in module.named_buffers(recurse=recurse)}
        if self.weights_map is None:
            self.weights_map = {
                n: t.detach().to("cpu")
                for n, t in named_module_tensors(module, include_buffers=self.offload_buffers, recurse=recurse)
            }
        modules = dict(module.named_modules()) if recurse else {"": module}
        self._slots = []
        for name, _tensor in named_module_tensors(
            module, include_buffers=self.offload_buffers, recurse=recurse, remove_non_persistent=True
        ):
            set_module_tensor_to_device(module, name, "meta")
            owner_name, _, attr = name.rpartition(".")
            owner = modules[owner_name]
            is_param = attr in owner._parameters
            current = owner._parameters[attr] if is_param else owner._buffers[attr]
            assert current is not None
            self._slots.append(_Slot(owner, attr, name, is_param, current))
        if self._device is not None:
            if not self.offload_buffers:
                for name, _ in module.named_buffers(recurse=recurse):
                    set_module_tensor_to_device(module, name, self._device)
            else:
                for name in get_non_persistent_buffers(module, recurse=recurse, fqns=True):
                    set_module_tensor_to_device(module, name, self._device)
        return module

    # -- weights ---------------------------------------------------------------------------------
    def materialize(self) -> list[torch.Tensor]:
        """The offloaded tensors of this module, read and moved to the execution device (thread-safe)."""
        weights_map = self.weights_map
        assert weights_map is not None
        reader = getattr(weights_map, "read", None)
        device = self._device
        zero_copy = bool(getattr(weights_map, "supports_zero_copy", False)) and (device is None or device.type == "cpu")
        values = []
        for slot in self._slots:
            if reader is None:
                value = weights_map[slot.key]
            elif zero_copy:
                value = reader(slot.key, zero_copy=True)
            else:
                value = reader(slot.key)
            values.append(value)
        return self.finish(values)

    def read_plan(self) -> list[Any] | None:
        """(location, wanted dtype) of each offloaded tensor when all are small disk weights, else None.

        The prefetcher reads such plans for many modules at once, coalescing adjacent bytes.
        """
        if self._plan_ready:
            return self._plan
        self._plan = self._compute_plan()
        self._plan_ready = True
        return self._plan

    def _compute_plan(self) -> list[Any] | None:
        weights_map = self.weights_map
        finder = getattr(weights_map, "location", None)
        if finder is None:
            return None
        plan = []
        for slot in self._slots:
            try:
                found = finder(slot.key)
            except KeyError:
                return None
            if found is None or found[0].nbytes >= MAP_THRESHOLD:
                return None
            plan.append(found)
        return plan

    def finish(self, raw: list[torch.Tensor]) -> list[torch.Tensor]:
        """Move CPU tensors read for this module's slots to the execution device, in the model's dtypes, as parameters.

        Args:
            raw: Slot name -> the CPU tensor read for it.
        """
        device = self._device
        values = []
        for slot, value in zip(self._slots, raw):
            if device is not None and value.device != device:
                value = value.to(device, non_blocking=device.type == "cuda")
            if value.dtype != slot.dtype and value.is_floating_point():
                value = value.to(slot.dtype)
            if slot.is_param:
                value = (
                    nn.Parameter(value, requires_grad=slot.requires_grad)
                    if slot.cls is nn.Parameter
                    else _as_param(slot, value)
                )
            values.append(value)
        return values

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Bring the weights (when offloaded) and the inputs to the execution device.

        Args:
            module: The module.
            *args: The positional inputs of the forward.
            **kwargs: The keyword inputs of the forward.
        """
        if self.io_same_device:
            self.input_device = find_device([args, kwargs])
        if self.offload and self._slots:
            if self.prefetcher is not None and self.prefetch_slot is not None:
                values = self.prefetcher.fetch(self.prefetch_slot)
            else:
                values = self.materialize()
            for slot, value in zip(self._slots, values):
                if slot.is_param:
                    slot.owner._parameters[slot.attr] = value
                else:
                    slot.owner._buffers[slot.attr] = value
        device = self._device
        if device is None:
            return args, kwargs
        if len(args) == 1 and not kwargs:  # the common case, kept cheap for models of many small layers
            arg = args[0]
            if isinstance(arg, torch.Tensor) and arg.device == device:
                return args, kwargs
        return _send(args, device, None), (_send(kwargs, device, self.skip_keys) if kwargs else kwargs)

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        """Release offloaded weights again, and move the outputs back to the inputs' device when asked.

        Args:
            module: The module.
            output: The output of the forward.
        """
        if self.offload:
            for slot in self._slots:
                if slot.is_param:
                    slot.owner._parameters[slot.attr] = slot.placeholder  # type: ignore[assignment]
                else:
                    slot.owner._buffers[slot.attr] = slot.placeholder
        if self.io_same_device and self.input_device is not None:
            output = send_to_device(output, self.input_device, skip_keys=self.skip_keys)
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        """Put offloaded weights back in place as real tensors.

        Args:
            module: The module.
        """
        if self.offload and self.weights_map is not None:
            originals = {**self.buffer_original_devices, **self.param_original_devices}
            for name, device in originals.items():
                if device.type != "meta" and name in self.weights_map:
                    set_module_tensor_to_device(module, name, device, value=self.weights_map[name])
        return module


def _as_param(slot: _Slot, value: torch.Tensor) -> nn.Parameter:
    try:
        cls: Any = slot.cls
        return cls(value, requires_grad=slot.requires_grad)
    except TypeError:
        return nn.Parameter(value, requires_grad=slot.requires_grad)


def _modules_with_tensors(module: nn.Module) -> set[str]:
    names: set[str] = set()
    for full, _, _ in iter_module_tensors(module):
        probe = full.rpartition(".")[0] if "." in full else ""
        while True:
            if probe in names:
                break
            names.add(probe)
            if not probe:
                break
            probe = probe.rpartition(".")[0] if "." in probe else ""
    return names


def _has_direct_tensors(module: nn.Module) -> bool:
    return any(v is not None for v in module._parameters.values()) or any(
        v is not None for v in module._buffers.values()
    )


def attach_execution_device_hook(
    module: nn.Module,
    execution_device: int | str | torch.device,
    skip_keys: str | list[str] | None = None,
    preload_module_classes: list[str] | None = None,
    tied_params_map: dict[int, dict[Any, torch.Tensor]] | None = None,
) -> None:
    """Add a hook moving inputs to ``execution_device`` on every submodule holding tensors (without one).

    Args:
        module: The module.
        execution_device: The device the forward runs on (weights and inputs are brought there); `None` uses
            the model's first device / the current accelerator.
        skip_keys: Keys of dict inputs and outputs that are not moved between devices.
        preload_module_classes: Class names of modules whose weights are all loaded at the start of their
            forward (for modules that use their submodules' weights directly).
        tied_params_map: Shared cache of tied weights already moved to the execution device (data pointer ->
            device -> tensor), so a tied weight is moved once.
    """
    with_tensors = _modules_with_tensors(module)
    preload = set(preload_module_classes or [])
    stack: list[tuple[str, nn.Module]] = [("", module)]
    while stack:
        name, sub = stack.pop()
        if not hasattr(sub, "_hf_hook") and name in with_tensors:
            add_hook_to_module(
                sub, AlignDevicesHook(execution_device, skip_keys=skip_keys, tied_params_map=tied_params_map)
            )
        if type(sub).__name__ in preload:
            continue
        for child_name, child in reversed(list(sub.named_children())):
            stack.append((f"{name}.{child_name}" if name else child_name, child))


def attach_align_device_hook(
    module: nn.Module,
    execution_device: int | str | torch.device | None = None,
    offload: bool = False,
    weights_map: Mapping[str, Any] | None = None,
    offload_buffers: bool = False,
    module_name: str = "",
    skip_keys: str | list[str] | None = None,
    preload_module_classes: list[str] | None = None,
    tied_params_map: dict[int, dict[Any, torch.Tensor]] | None = None,
) -> None:
    """Add an `AlignDevicesHook` to every submodule with direct weights (whole ``preload_module_classes`` blocks at once).

    Args:
        module: The module.
        execution_device: The device the forward runs on (weights and inputs are brought there); `None` uses
            the model's first device / the current accelerator.
        offload: Keep the weights off the execution device, bringing them there only for the forward.
        weights_map: Mapping name -> tensor the offloaded weights are read from (for example an
            `OffloadedWeightsLoader`).
        offload_buffers: Offload the buffers with the weights (else buffers stay on the execution device).
        module_name: Name of `module` in the model (the prefix of its weights' names).
        skip_keys: Keys of dict inputs and outputs that are not moved between devices.
        preload_module_classes: Class names of modules whose weights are all loaded at the start of their
            forward (for modules that use their submodules' weights directly).
        tied_params_map: Shared cache of tied weights already moved to the execution device (data pointer ->
            device -> tensor), so a tied weight is moved once.
    """
    preload = set(preload_module_classes or [])
    stack: list[tuple[str, nn.Module]] = [(module_name, module)]
    while stack:
        name, sub = stack.pop()
        has_direct = _has_direct_tensors(sub)
        full_offload = offload and type(sub).__name__ in preload
        if has_direct or full_offload:
            prefixed = PrefixedDataset(weights_map, f"{name}." if name else "") if weights_map is not None else None
            hook = AlignDevicesHook(
                execution_device=execution_device,
                offload=offload,
                weights_map=prefixed,
                offload_buffers=offload_buffers,
                place_submodules=full_offload,
                skip_keys=skip_keys,
                tied_params_map=tied_params_map,
            )
            add_hook_to_module(sub, hook, append=True)
        if full_offload:
            continue
        for child_name, child in reversed(list(sub.named_children())):
            stack.append((f"{name}.{child_name}" if name else child_name, child))


def attach_align_device_hook_on_blocks(
    module: nn.Module,
    execution_device: int | str | torch.device | Mapping[str, Any] | None = None,
    offload: bool | Mapping[str, bool] = False,
    weights_map: Mapping[str, Any] | None = None,
    offload_buffers: bool = False,
    module_name: str = "",
    skip_keys: str | list[str] | None = None,
    preload_module_classes: list[str] | None = None,
    tied_params_map: dict[int, dict[Any, torch.Tensor]] | None = None,
) -> None:
    """Attach hooks block by block, following per-block ``execution_device`` and ``offload`` maps.

    Args:
        module: The module.
        execution_device: The device the forward runs on (weights and inputs are brought there); `None` uses
            the model's first device / the current accelerator.
        offload: Keep the weights off the execution device, bringing them there only for the forward.
        weights_map: Mapping name -> tensor the offloaded weights are read from (for example an
            `OffloadedWeightsLoader`).
        offload_buffers: Offload the buffers with the weights (else buffers stay on the execution device).
        module_name: Name of `module` in the model (the prefix of its weights' names).
        skip_keys: Keys of dict inputs and outputs that are not moved between devices.
        preload_module_classes: Class names of modules whose weights are all loaded at the start of their
            forward (for modules that use their submodules' weights directly).
        tied_params_map: Shared cache of tied weights already moved to the execution device (data pointer ->
            device -> tensor), so a tied weight is moved once.
    """
    if not isinstance(execution_device, Mapping) and not isinstance(offload, Mapping):
        if not offload:
            add_hook_to_module(
                module,
                AlignDevicesHook(
                    execution_device,
                    io_same_device=True,
                    skip_keys=skip_keys,
                    place_submodules=True,
                    tied_params_map=tied_params_map,
                ),
            )
        else:
            attach_align_device_hook(
                module,
                execution_device,
                offload=True,
                weights_map=weights_map,
                offload_buffers=offload_buffers,
                module_name=module_name,
                skip_keys=skip_keys,
                tied_params_map=tied_params_map,
            )
        return
    devices = execution_device if isinstance(execution_device, Mapping) else dict.fromkeys(offload, execution_device)  # type: ignore[arg-type]
    offloads = offload if isinstance(offload, Mapping) else dict.fromkeys(devices, offload)
    stack: list[tuple[str, nn.Module]] = [(module_name, module)]
    while stack:
        name, sub = stack.pop()
        if name in devices and name in offloads and not offloads[name]:
            add_hook_to_module(
                sub,
                AlignDevicesHook(
                    devices[name],
                    offload_buffers=offload_buffers,
                    io_same_device=(name == ""),
                    place_submodules=True,
                    skip_keys=skip_keys,
                    tied_params_map=tied_params_map,
                ),
            )
            attach_execution_device_hook(sub, devices[name], skip_keys=skip_keys, tied_params_map=tied_params_map)  # type: ignore[arg-type]
        elif name in devices and name in offloads:
            attach_align_device_hook(
                sub,
                devices[name],
                offload=True,
                weights_map=weights_map,
                offload_buffers=offload_buffers,
                module_name=name,
                skip_keys=skip_keys,
                preload_module_classes=preload_module_classes,
                tied_params_map=tied_params_map,
            )
            if not hasattr(sub, "_hf_hook"):
                add_hook_to_module(
                    sub,
                    AlignDevicesHook(
                        devices[name], io_same_device=(name == ""), skip_keys=skip_keys, tied_params_map=tied_params_map
                    ),
                )
            attach_execution_device_hook(
                sub,
                devices[name],  # type: ignore[arg-type]
                skip_keys=skip_keys,
                preload_module_classes=preload_module_classes,
                tied_params_map=tied_params_map,
            )
        elif name == "":
            add_hook_to_module(
                sub,
                AlignDevicesHook(
                    execution_device=devices.get(""),
                    io_same_device=True,
                    skip_keys=skip_keys,
                    tied_params_map=tied_params_map,
                ),
            )
        for child_name, child in reversed(list(sub.named_children())):
            stack.append((f"{name}.{child_name}" if name else child_name, child))


class CpuOffload(ModelHook):
    """Keep a whole model on the CPU and move it to ``execution_device`` for its forward (it stays there until offloaded).

    Args:
        execution_device: The device the forward runs on (weights and inputs are brought there); `None` uses
            the model's first device / the current accelerator.
        prev_module_hook: The hook of the model that runs before this one; it offloads that model when this
            one runs.
    """

    def __init__(
        self,
        execution_device: int | str | torch.device | None = None,
        prev_module_hook: UserCpuOffloadHook | None = None,
    ):
        self.prev_module_hook = prev_module_hook
        if execution_device is None:
            from accel_state.state import PartialState

            execution_device = PartialState().default_device
        self.execution_device = _device(execution_device)

    def init_hook(self, module: nn.Module) -> nn.Module:
        """Move the module to the CPU.

        Args:
            module: The module.
        """
        return module.to("cpu")

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Offload the previous model (if any), move this one to the execution device, and its inputs too.

        Args:
            module: The module.
            *args: The positional inputs of the forward.
            **kwargs: The keyword inputs of the forward.
        """
        if self.prev_module_hook is not None:
            self.prev_module_hook.offload()
            from accel_state.memory import clear_device_cache

            clear_device_cache()
        module.to(self.execution_device)
        return send_to_device(args, self.execution_device), send_to_device(kwargs, self.execution_device)


class UserCpuOffloadHook:
    """Handle returned by ``cpu_offload_with_hook``: ``offload()`` sends the model back to the CPU, ``remove()`` drops the hook.

    Args:
        model: The model the hook is attached to.
        hook: The `CpuOffload` hook.
    """

    def __init__(self, model: nn.Module, hook: ModelHook):
        self.model = model
        self.hook = hook

    def offload(self) -> None:
        """Send the model back to the CPU."""
        self.hook.init_hook(self.model)

    def remove(self) -> None:
        """Remove the hook from the model."""
        remove_hook_from_module(self.model)


class LayerwiseCastingHook(ModelHook):
    """Store a layer's weights in ``storage_dtype`` and cast them to ``compute_dtype`` only for its forward.

    Args:
        storage_dtype: The dtype weights are stored in.
        compute_dtype: The dtype weights are cast to for the forward.
        non_blocking: Copy asynchronously where the device allows it.
    """

    _is_stateful = False

    def __init__(self, storage_dtype: torch.dtype, compute_dtype: torch.dtype, non_blocking: bool):
        self.storage_dtype = storage_dtype
        self.compute_dtype = compute_dtype
        self.non_blocking = non_blocking

    def init_hook(self, module: nn.Module) -> nn.Module:
        """Cast the layer's weights to the storage dtype.

        Args:
            module: The module.
        """
        return module.to(dtype=self.storage_dtype, non_blocking=self.non_blocking)

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Cast the weights to the compute dtype for the forward.

        Args:
            module: The module.
            *args: The positional inputs of the forward.
            **kwargs: The keyword inputs of the forward.
        """
        module.to(dtype=self.compute_dtype, non_blocking=self.non_blocking)
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        """Cast the weights back to the storage dtype.

        Args:
            module: The module.
            output: The output of the forward.
        """
        module.to(dtype=self.storage_dtype, non_blocking=self.non_blocking)
        return output
