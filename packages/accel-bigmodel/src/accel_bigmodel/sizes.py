"""Byte sizes of dtypes, tensors and modules, and parsing of human memory sizes ("10GiB", "10GB").

Pure arithmetic over a module's tensors: nothing is read from disk and no device is touched, so it
works on a model built on the meta device.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*$")


def parse_size(size: int | float | str) -> int:
    """Number of bytes in ``size``: an int passes through, a float is rounded down, "10GB" is 10**10,
    "10GiB" is 10 * 2**30.

    Args:
        size: An int of bytes, or text such as `"10GB"` / `"10GiB"`.
    """
    if isinstance(size, bool):
        raise TypeError(f"A memory size must be an int of bytes or a string like '10GiB', got {size!r}.")
    if isinstance(size, int):
        if size < 0:
            raise ValueError(f"A memory size cannot be negative, got {size}.")
        return size
    if isinstance(size, float):
        # callers compute budgets as fractions (``available * 0.9``): whole bytes, rounded down
        if size != size or size in (float("inf"), float("-inf")) or size < 0:
            raise ValueError(f"A memory size must be a finite number of bytes >= 0, got {size!r}.")
        return int(size)
    if not isinstance(size, str):
        raise TypeError(f"A memory size must be an int of bytes or a string like '10GiB', got {size!r}.")
    match = _SIZE_RE.match(size)
    unit = match.group(2).upper() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(
            f"Cannot parse the memory size {size!r}: write a number of bytes or a number followed by one of "
            "B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024), e.g. '10GiB'."
        )
    value = float(match.group(1)) * _UNITS[unit]
    return int(value)


def convert_file_size_to_int(size: int | float | str) -> int:
    """Documented name of `parse_size()`.

    Args:
        size: An int of bytes, or text such as `"10GB"` / `"10GiB"`.
    """
    return parse_size(size)


_SUB_BYTE = {"int4": 0.5, "fp4": 0.5, "nf4": 0.5, "int2": 0.25}


_BYTE_SIZES: dict[torch.dtype, float] = {}


def dtype_byte_size(dtype: torch.dtype | str) -> float:
    """Bytes taken by one element of ``dtype`` (``torch.bool`` counts 1/8, "int4" counts 1/2).

    Args:
        dtype: A `torch.dtype`, or `"int4"` / `"int8"` / `"fp8"` text.
    """
    cached = _BYTE_SIZES.get(dtype) if isinstance(dtype, torch.dtype) else None
    if cached is not None:
        return cached
    if isinstance(dtype, str):
        if dtype in _SUB_BYTE:
            return _SUB_BYTE[dtype]
        dtype = str_to_dtype(dtype)
    size = 1 / 8 if dtype == torch.bool else float(torch.empty((), dtype=dtype, device="meta").element_size())
    _BYTE_SIZES[dtype] = size
    return size


def str_to_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``torch.float16`` from "float16", "torch.float16" or the dtype itself; a clear error otherwise."""
    if isinstance(dtype, torch.dtype):
        return dtype
    name = dtype.replace("torch.", "")
    value = getattr(torch, name, None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"{dtype!r} is not a torch dtype; use names like 'float32', 'float16' or 'bfloat16'.")
    return value


def walk_modules(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """(name, module) for ``model`` and every submodule, as ``named_modules(remove_duplicate=False)`` gives
    them (same order, shared modules under each of their names), from one explicit stack instead of a
    generator per nesting level, which costs a call per level for every module of a deep model."""
    stack: list[tuple[str, nn.Module]] = [("", model)]
    while stack:
        prefix, module = stack.pop()
        yield prefix, module
        children = module._modules
        if children:
            dot = f"{prefix}." if prefix else ""
            stack.extend((dot + name, child) for name, child in reversed(children.items()) if child is not None)


def iter_module_tensors(model: nn.Module, remove_duplicate: bool = True) -> Iterator[tuple[str, torch.Tensor, bool]]:
    """(full name, tensor, is_parameter) for every parameter then buffer of each module, in one walk.

    Much cheaper than ``named_parameters`` + ``named_buffers`` on models with many modules.
    """
    seen: set[int] = set()
    for prefix, module in walk_modules(model):
        dot = f"{prefix}." if prefix else ""
        for name, param in module._parameters.items():
            if param is None:
                continue
            if remove_duplicate:
                if id(param) in seen:
                    continue
                seen.add(id(param))
            yield dot + name, param, True
        for name, buf in module._buffers.items():
            if buf is None:
                continue
            if remove_duplicate:
                if id(buf) in seen:
                    continue
                seen.add(id(buf))
            yield dot + name, buf, False


def named_module_tensors(
    module: nn.Module, include_buffers: bool = True, recurse: bool = False, remove_non_persistent: bool = False
) -> Iterator[tuple[str, torch.Tensor]]:
    """Parameters (and buffers) of ``module`` by name; non-persistent buffers skipped when asked.

    Args:
        module: The module.
        include_buffers: Include the buffers.
        recurse: Also go through the submodules.
        remove_non_persistent: Leave out buffers that are not saved in the state dict.
    """
    yield from module.named_parameters(recurse=recurse)
    if include_buffers:
        skip = get_non_persistent_buffers(module, recurse=recurse, fqns=True) if remove_non_persistent else set()
        for name, buf in module.named_buffers(recurse=recurse):
            if name not in skip:
                yield name, buf


def get_non_persistent_buffers(module: nn.Module, recurse: bool = False, fqns: bool = False) -> set[str]:
    """Names of the buffers that are not saved in the state dict.

    Args:
        module: The module.
        recurse: Also go through the submodules.
        fqns: Return fully qualified names (else local names).
    """
    if not recurse:
        return set(module._non_persistent_buffers_set)
    names: set[str] = set()
    for prefix, sub in module.named_modules():
        for name in sub._non_persistent_buffers_set:
            names.add(f"{prefix}.{name}" if (fqns and prefix) else name)
    return names


def _size_fn(dtype: Any, special_dtypes: dict[str, Any] | None) -> Any:
    target = None if dtype is None else dtype_byte_size(dtype)
    special = {k: dtype_byte_size(v) for k, v in (special_dtypes or {}).items()}

    def size(name: str, tensor: torch.Tensor) -> int:
        if name in special:
            return int(tensor.numel() * special[name])
        own = dtype_byte_size(tensor.dtype)
        if target is None or not tensor.is_floating_point():
            return int(tensor.numel() * own)
        return int(tensor.numel() * min(target, own))

    return size


def compute_module_sizes(
    model: nn.Module,
    dtype: str | torch.dtype | None = None,
    special_dtypes: dict[str, str | torch.dtype] | None = None,
    buffers_only: bool = False,
) -> dict[str, int]:
    """Size in bytes of every submodule and tensor of ``model`` (key "" is the whole model), one pass.

    Args:
        model: The model (an `nn.Module`).
        dtype: The dtype the weights will have (sizes are computed and weights converted with it); `None`
            keeps each tensor's own.
        special_dtypes: Parameter name -> dtype, for weights that keep a dtype other than `dtype`.
        buffers_only: Count buffers only.
    """
    size_of = _size_fn(dtype, special_dtypes)
    sizes: dict[str, int] = {"": 0}
    for name, tensor, is_param in iter_module_tensors(model):
        if buffers_only and is_param:
            continue
        size = size_of(name, tensor)
        sizes[""] += size
        end = name.find(".")
        while end != -1:
            prefix = name[:end]
            sizes[prefix] = sizes.get(prefix, 0) + size
            end = name.find(".", end + 1)
        sizes[name] = sizes.get(name, 0) + size
    return sizes


def module_and_buffer_sizes(
    model: nn.Module,
    dtype: str | torch.dtype | None = None,
    special_dtypes: dict[str, Any] | None = None,
    tied: list[list[str]] | None = None,
) -> tuple[dict[str, int], dict[str, int]]:
    """(sizes of every module and tensor, sizes of the buffers under each module) in one walk.

    When ``tied`` is a list, the groups of tied parameter names found on the way are appended to it.
    """
    size_of = _size_fn(dtype, special_dtypes)
    plain = dtype is None and not special_dtypes
    sizes: dict[str, int] = {}
    buffers: dict[str, int] = {}
    first_name: dict[int, str] = {}
    aliases: dict[int, list[str]] = {}
    order: list[str] = []  # module names in pre-order; totals are summed bottom-up afterwards
    for prefix, module in walk_modules(model):
        dot = f"{prefix}." if prefix else ""
        own = own_buffers = 0
        for attr, param in module._parameters.items():
            if param is None:
                continue
            full = dot + attr
            key = id(param)
            if key in first_name:
                aliases.setdefault(key, [first_name[key]]).append(full)
                continue
            first_name[key] = full
            size = param.numel() * param.element_size() if plain and param.dtype != torch.bool else size_of(full, param)
            sizes[full] = size
            own += size
        for attr, buf in module._buffers.items():
            if buf is None or id(buf) in first_name:
                continue
            full = dot + attr
            first_name[id(buf)] = full
            size = size_of(full, buf)
            sizes[full] = buffers[full] = size
            own += size
            own_buffers += size
        if prefix in sizes:  # a shared module reached again under the same name: already counted
            continue
        sizes[prefix] = sizes.get(prefix, 0) + own
        buffers[prefix] = buffers.get(prefix, 0) + own_buffers
        order.append(prefix)
    for name in reversed(order):
        if name:
            parent = name.rpartition(".")[0]
            sizes[parent] += sizes[name]
            buffers[parent] += buffers[name]
    if tied is not None:
        tied.extend(sorted(sorted(group) for group in aliases.values()))
    return sizes, {k: v for k, v in buffers.items() if v or k == ""}


def _add(sizes: dict[str, int], buffers: dict[str, int] | None, name: str, size: int) -> None:
    for table in (sizes,) if buffers is None else (sizes, buffers):
        table[""] += size
        end = name.find(".")
        while end != -1:
            prefix = name[:end]
            table[prefix] = table.get(prefix, 0) + size
            end = name.find(".", end + 1)
        table[name] = table.get(name, 0) + size


def compute_module_total_buffer_size(
    model: nn.Module, dtype: str | torch.dtype | None = None, special_dtypes: dict[str, Any] | None = None
) -> int:
    """Total bytes of the buffers of ``model``.

    Args:
        model: The model (an `nn.Module`).
        dtype: The dtype the weights will have (sizes are computed and weights converted with it); `None`
            keeps each tensor's own.
        special_dtypes: Parameter name -> dtype, for weights that keep a dtype other than `dtype`.
    """
    return compute_module_sizes(model, dtype, special_dtypes, buffers_only=True)[""]


def get_max_layer_size(
    modules: list[tuple[str, nn.Module]], module_sizes: dict[str, int], no_split_module_classes: list[str]
) -> tuple[int, list[str]]:
    """Biggest unsplittable layer among ``modules`` (a leaf or a ``no_split_module_classes`` block).

    Args:
        modules: The `(name, module)` pairs to consider.
        module_sizes: Module name -> size in bytes, as `compute_module_sizes` gives.
        no_split_module_classes: Class names of modules that must stay whole on one device (for example a
            transformer block).
    """
    best, names = 0, []
    stack = list(reversed(modules))
    no_split = set(no_split_module_classes or [])
    while stack:
        name, module = stack.pop()
        children = list(module.named_children()) if isinstance(module, nn.Module) else []
        if not children or module.__class__.__name__ in no_split:
            size = module_sizes.get(name, 0)
            if size > best:
                best, names = size, [name]
            elif size == best:
                names.append(name)
        else:
            stack.extend(reversed([(f"{name}.{n}" if name else n, c) for n, c in children]))
    return best, names


def calculate_maximum_sizes(model: nn.Module) -> tuple[int, tuple[int, list[str]]]:
    """(total size, (largest layer size, its names)) of ``model`` with its own dtypes.

    Args:
        model: The model (an `nn.Module`).
    """
    sizes = compute_module_sizes(model)
    no_split = getattr(model, "_no_split_modules", None) or []
    modules = [(n, c) for n, c in model.named_children()]
    return sizes[""], get_max_layer_size(modules, sizes, no_split)


def get_module_leaves(module_sizes: dict[str, int]) -> list[str]:
    """Names in ``module_sizes`` that have no child entry.

    Args:
        module_sizes: Module name -> size, as `compute_module_sizes` gives.
    """
    parents = set()
    for name in module_sizes:
        end = name.rfind(".")
        parents.add(name[:end] if end != -1 else "")
    return [name for name in module_sizes if name and name not in parents]


def id_tensor_storage(tensor: torch.Tensor) -> tuple[torch.device, int, int]:
    """Identity of the storage behind ``tensor``: tensors sharing memory share it.

    Args:
        tensor: The tensor.
    """
    if tensor.device.type == "meta":
        return tensor.device, id(tensor), 0
    storage = tensor.untyped_storage()
    return tensor.device, storage.data_ptr(), storage.nbytes()
