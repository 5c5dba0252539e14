"""Device-map planning: where each module goes, given memory budgets. Pure logic, no I/O.

`infer_auto_device_map()` walks the model once in execution order and fills devices greedily
(GPUs in order, then CPU, then disk), splitting a module into its children only when it does not fit.
Every step is O(1) amortised (a deque for the queue, a suffix maximum for the largest remaining layer,
prefix tables for tied parameters), so planning is linear in the number of modules.
"""

from __future__ import annotations

import functools
import gc
import logging
import warnings
from collections import deque
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from accel_bigmodel.sizes import (
    compute_module_sizes,
    get_module_leaves,
    iter_module_tensors,
    module_and_buffer_sizes,
    parse_size,
)
from accel_bigmodel.tied import check_tied_parameters_in_config

DeviceKey = int | str
logger = logging.getLogger(__name__)


def _sort_key(device: DeviceKey) -> tuple[int, Any]:
    if isinstance(device, int):
        return (0, device)
    if device == "cpu":
        return (2, 0)
    if device == "disk":
        return (3, 0)
    return (1, str(device))


def normalize_max_memory(max_memory: Mapping[Any, int | str]) -> dict[DeviceKey, int]:
    """Validate ``max_memory`` and return it with sizes in bytes, ordered: accelerators, cpu, disk."""
    result: dict[DeviceKey, int] = {}
    for key, value in max_memory.items():
        device: DeviceKey
        if isinstance(key, torch.device):
            key = str(key)
        if isinstance(key, bool):
            raise ValueError(
                f"max_memory key {key!r} is not a device: use GPU indices (0, 1, ...), 'mps', 'cpu' or 'disk'."
            )
        if isinstance(key, int):
            if key < 0:
                raise ValueError(f"max_memory key {key} is not a device index: indices start at 0.")
            device = key
        elif isinstance(key, str) and key.isdigit():
            device = int(key)
        elif isinstance(key, str) and (key in ("cpu", "disk", "mps") or _is_indexed_device(key)):
            device = key
        else:
            raise ValueError(
                f"max_memory key {key!r} is not a device: use GPU indices (0, 1, ...), 'mps', 'cpu' or 'disk' "
                "(or 'xpu:0'-style names)."
            )
        try:
            result[device] = parse_size(value)
        except (ValueError, TypeError) as err:
            raise ValueError(f"max_memory[{key!r}]: {err}") from None
    return dict(sorted(result.items(), key=lambda item: _sort_key(item[0])))


def _is_indexed_device(key: str) -> bool:
    kind, sep, index = key.partition(":")
    return bool(sep) and kind.isidentifier() and index.isdigit()


def _check_no_split(model: nn.Module, no_split_module_classes: list[str] | str | None) -> list[str]:
    if no_split_module_classes is None:
        return []
    if isinstance(no_split_module_classes, str):
        no_split_module_classes = [no_split_module_classes]
    names = list(no_split_module_classes)
    present = {type(m).__name__ for m in model.modules()}
    unknown = [n for n in names if n not in present]
    if unknown:
        raise ValueError(
            f"no_split_module_classes names classes that are not in the model: {unknown}. "
            f"Classes in the model: {sorted(present)}."
        )
    return names


class _Units:
    """Largest unsplittable layer among the modules still to place, as a suffix maximum over DFS order."""

    def __init__(self, model: nn.Module, sizes: dict[str, int], no_split: set[str]):
        self.ranges: dict[str, tuple[int, int]] = {}
        unit_sizes: list[int] = []
        # iterative post-order DFS assigning unit indices in execution (registration) order
        stack: list[tuple[str, nn.Module, bool]] = [("", model, False)]
        starts: dict[str, int] = {}
        while stack:
            name, module, done = stack.pop()
            if done:
                self.ranges[name] = (starts[name], len(unit_sizes))
                continue
            children = [(k, v) for k, v in module._modules.items() if v is not None]
            starts[name] = len(unit_sizes)
            if name and (not children or type(module).__name__ in no_split):
                unit_sizes.append(sizes.get(name, 0))
                self.ranges[name] = (starts[name], len(unit_sizes))
                continue
            stack.append((name, module, True))
            for child_name, child in reversed(children):
                stack.append((f"{name}.{child_name}" if name else child_name, child, False))
        self.unit_sizes = unit_sizes
        self.suffix_max = [0] * (len(unit_sizes) + 1)
        for i in range(len(unit_sizes) - 1, -1, -1):
            self.suffix_max[i] = max(unit_sizes[i], self.suffix_max[i + 1])

    def remove(self, name: str) -> None:
        """Module ``name`` was placed ahead of its turn (with a tied module, or by fallback allocation):
        its layers no longer count toward the reserve.

        Each layer is removed at most once, and the suffix maxima are updated only down to the first one
        that does not change, so removals add no more than linear work in total for realistic models.
        """
        if name not in self.ranges:
            return
        start, end = self.ranges[name]
        sizes, suffix = self.unit_sizes, self.suffix_max
        for i in range(start, end):
            sizes[i] = 0
        for i in range(end - 1, -1, -1):
            value = max(sizes[i], suffix[i + 1])
            if i < start and value == suffix[i]:
                break
            suffix[i] = value

    def after(self, name: str) -> int:
        """Largest layer placed after module ``name`` (a parameter counts as its module's start)."""
        if name in self.ranges:
            return self.suffix_max[self.ranges[name][1]]
        parent = name.rpartition(".")[0]
        return self.suffix_max[self.ranges.get(parent, (0, 0))[0]]


class _Ties:
    """For a module name, the tied parameters that live outside it (prefix tables, O(depth) per lookup)."""

    def __init__(self, groups: list[list[str]]):
        self.groups = groups
        self.inside: dict[str, dict[int, int]] = {}
        for gi, group in enumerate(groups):
            for member in group:
                prefix = member
                while True:
                    counts = self.inside.setdefault(prefix, {})
                    counts[gi] = counts.get(gi, 0) + 1
                    if "." not in prefix:
                        break
                    prefix = prefix.rpartition(".")[0]

    def outside(self, name: str) -> list[str]:
        if not self.groups or not name:
            return []
        result: list[str] = []
        for gi, count in self.inside.get(name, {}).items():
            group = self.groups[gi]
            if count < len(group):
                result.extend(m for m in group if not (m == name or m.startswith(name + ".")))
        return result


def _without_gc(fn: Any) -> Any:
    """Run ``fn`` with the cyclic garbage collector paused: planning allocates many small objects while the
    model holds many, and repeated collections would make it superlinear."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        enabled = gc.isenabled()
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            if enabled:
                gc.enable()

    return wrapper


@_without_gc
def infer_auto_device_map(
    model: nn.Module,
    max_memory: Mapping[Any, int | str] | None = None,
    no_split_module_classes: list[str] | str | None = None,
    dtype: str | torch.dtype | None = None,
    special_dtypes: dict[str, str | torch.dtype] | None = None,
    verbose: bool = False,
    clean_result: bool = True,
    offload_buffers: bool = False,
    fallback_allocation: bool = False,
) -> dict[str, DeviceKey]:
    """Map module names to devices: fill the accelerators in order, then the CPU, then the disk.

    On the first accelerator (or the CPU when there is none) room for the largest layer is kept free,
    since offloaded layers are brought there to run. Modules of ``no_split_module_classes`` are never
    split; tied parameters are placed together.

    Args:
        model: The model (an `nn.Module`).
        max_memory: Device -> memory budget (an int of bytes or text such as `"10GiB"`); `None` uses what is
            free.
        no_split_module_classes: Class names of modules that must stay whole on one device (for example a
            transformer block).
        dtype: The dtype the weights will have (sizes are computed and weights converted with it); `None`
            keeps each tensor's own.
        special_dtypes: Parameter name -> dtype, for weights that keep a dtype other than `dtype`.
        verbose: Log each placement decision.
        clean_result: Merge entries of one parent that share a device (`clean_device_map`).
        offload_buffers: Offload the buffers with the weights (else buffers stay on the execution device).
        fallback_allocation: When no whole layer fits the main device, place a smaller one there so it is not
            left empty.
    """
    if max_memory is None:
        from accel_bigmodel.device_memory import get_max_memory

        max_memory = get_max_memory()
    budgets = normalize_max_memory(max_memory)
    no_split = _check_no_split(model, no_split_module_classes)
    no_split_set = set(no_split)
    devices: list[DeviceKey] = list(budgets)
    if "disk" not in devices:
        devices.append("disk")
    accelerators = [d for d in devices if d not in ("cpu", "disk")]
    main_devices = {accelerators[0], "cpu"} if accelerators else {"cpu"}

    tied_groups: list[list[str]] = []
    sizes, buffer_sizes = module_and_buffer_sizes(model, dtype=dtype, special_dtypes=special_dtypes, tied=tied_groups)
    if not tied_groups and check_tied_parameters_in_config(model):
        warnings.warn(
            "The model config says some weights are tied but none are: call model.tie_weights() before "
            "computing the device map.",
            stacklevel=2,
        )
    ties = _Ties(tied_groups)
    units = _Units(model, sizes, no_split_set)

    queue: deque[tuple[str, Any]] = deque()
    queued: set[str] = set()

    def push_front(entries: list[tuple[str, Any]]) -> None:
        for entry in reversed(entries):
            queue.appendleft(entry)
            queued.add(entry[0])

    top = (
        list(model.named_parameters(recurse=False))
        + list(model.named_children())
        + list(model.named_buffers(recurse=False))
    )
    root_buffers = {n for n, _ in model.named_buffers(recurse=False)}
    for entry in top:
        queue.append(entry)
        queued.add(entry[0])

    device_map: dict[str, DeviceKey] = {}
    used = dict.fromkeys(devices, 0)
    offloaded_buffers = 0
    minimum_needed: dict[DeviceKey, int] = {}
    kept_free: dict[DeviceKey, int] = {}
    current = 0

    def find_queued(param: str) -> str | None:
        probe = param
        while True:
            if probe in queued:
                return probe
            if "." not in probe:
                return None
            probe = probe.rpartition(".")[0]

    while queue:
        name, module = queue.popleft()
        if name not in queued:  # already placed with a tied module
            continue
        queued.discard(name)
        device = devices[current]
        max_layer = 0 if name in root_buffers else units.after(name)
        limit = budgets.get(device) if device != "disk" else None
        reserved = 0
        if limit is not None and device in main_devices:
            reserved = max_layer
            limit -= max_layer
        size = sizes.get(name, 0)
        tied_outside = ties.outside(name)
        tied_modules: list[str] = []
        for param in tied_outside:
            owner = find_queued(param)
            if owner is not None and owner not in tied_modules:
                tied_modules.append(owner)
                size += sizes.get(owner, 0) - sizes.get(param, 0)
        if verbose:
            print(
                f"Treating module {name} (size {size}, device {device}, room {None if limit is None else limit - used[device]})."
            )

        if limit is None or used[device] + size <= limit:
            used[device] += size
            device_map[name] = device
            for owner in tied_modules:
                queued.discard(owner)
                device_map[owner] = device
                units.remove(owner)  # placed now: no longer part of the largest-layer reserve
            if device in ("cpu", "disk") and accelerators and not offload_buffers:
                offloaded_buffers += buffer_sizes.get(name, 0)
            if verbose:
                print(f"Putting {name}{' and ' + ', '.join(tied_modules) if tied_modules else ''} on {device}.")
            continue

        # Does not fit. When the module alone would fit, split a module it is tied to; when the module
        # alone does not fit, split the module itself; else go to the next device.
        alone = sizes.get(name, 0)
        if tied_modules and used[device] + alone <= limit:  # type: ignore[operator]
            split = False
            for owner in tied_modules:
                owner_module = model.get_submodule(owner)
                children = list(owner_module.named_children())
                if not children or type(owner_module).__name__ in no_split_set:
                    continue
                expanded: list[tuple[str, Any]] = [
                    (f"{owner}.{n}", v) for n, v in owner_module.named_parameters(recurse=False)
                ]
                expanded += [(f"{owner}.{n}", v) for n, v in children]
                rest = list(queue)
                at = next(i for i, (n, _) in enumerate(rest) if n == owner)
                queue.clear()
                queued.discard(owner)
                for entry in rest[:at] + expanded + rest[at + 1 :]:
                    queue.append(entry)
                    queued.add(entry[0])
                push_front([(name, module)])
                split = True
                if verbose:
                    print(f"Splitting tied module {owner}.")
                break
            if split:
                continue
        if used[device] + alone >= limit and isinstance(module, nn.Module):  # type: ignore[operator]
            children = list(module.named_children())
            if children and type(module).__name__ not in no_split_set:
                expanded = [(f"{name}.{n}", v) for n, v in module.named_parameters(recurse=False)]
                expanded += [(f"{name}.{n}", v) for n, v in children]
                push_front(expanded)
                if verbose:
                    print(f"Splitting {name}.")
                continue

        found = None
        if used[device] == 0:
            if fallback_allocation and limit is not None:
                found = _fallback(queue, queued, (name, module), sizes, limit - used[device], no_split_set, ties)
                if found is not None:
                    used[device] += sizes.get(found, 0)
                    device_map[found] = device
                    units.remove(found)
                    if verbose:
                        print(f"Fallback allocation: putting {found} on {device}.")
            else:
                minimum_needed[device] = size + reserved
        if verbose:
            print(f"Not enough room on {device} for {name}; moving to {devices[current + 1]}.")
        kept_free[device] = reserved  # what stays free for the largest layer counts as used from now on
        current += 1
        if found is None:
            push_front([(name, module)])

    if clean_result:
        device_map = clean_device_map(device_map)
    if offloaded_buffers and accelerators:
        fits = any(budgets[d] >= offloaded_buffers + used.get(d, 0) + kept_free.get(d, 0) for d in accelerators)
        if not fits:
            message = (
                f"Current model requires {offloaded_buffers} bytes of buffer for offloaded layers, which does not "
                "fit the remaining memory of any accelerator (the room kept for the largest layer counts as used). "
                "If you run out of memory later, pass offload_buffers=True."
            )
            warnings.warn(message, stacklevel=2)
            logger.warning(message)
    unused = {d: m for d, m in minimum_needed.items() if used.get(d, 0) == 0}
    if unused:
        message = (
            "Nothing was assigned to these devices because of insufficient memory: their first module does not "
            f"fit (bytes needed including the reserve for the largest layer): {unused}. Raise their max_memory, "
            "split the module, or pass fallback_allocation=True."
        )
        warnings.warn(message, stacklevel=2)
        logger.info(message)
    return device_map


def _fallback(
    queue: deque[tuple[str, Any]],
    queued: set[str],
    current: tuple[str, Any],
    sizes: dict[str, int],
    limit: int,
    no_split: set[str],
    ties: _Ties,
) -> str | None:
    """First module (depth first from ``current``) that fits in ``limit``; the queue is rebuilt without it.

    ``current`` goes back into the queue (split around the found module when it contains it).
    """
    entries = [current, *queue]
    for index, (name, module) in enumerate(entries):
        stack = [(name, module)]
        while stack:
            cand_name, cand = stack.pop()
            fits = 0 < sizes.get(cand_name, 0) <= limit and isinstance(cand, nn.Module)
            if fits and not ties.outside(cand_name):
                # rebuild the queue: the entry is replaced by its expansion minus the found module
                replacement = _expand_without(name, module, cand_name, no_split)
                queue.clear()
                queued.clear()
                for entry in entries[:index] + replacement + entries[index + 1 :]:
                    queue.append(entry)
                    queued.add(entry[0])
                return cand_name
            if isinstance(cand, nn.Module) and type(cand).__name__ not in no_split:
                kids: list[tuple[str, Any]] = [(f"{cand_name}.{n}", v) for n, v in cand.named_parameters(recurse=False)]
                kids += [(f"{cand_name}.{n}", v) for n, v in cand.named_children()]
                stack.extend(reversed(kids))
    return None


def _expand_without(name: str, module: Any, target: str, no_split: set[str]) -> list[tuple[str, Any]]:
    """Entries covering ``name`` except ``target``: ancestors of ``target`` are split, others kept whole."""
    if name == target:
        return []
    if not target.startswith(name + "."):
        return [(name, module)]
    kids: list[tuple[str, Any]] = [(f"{name}.{n}", v) for n, v in module.named_parameters(recurse=False)]
    kids += [(f"{name}.{n}", v) for n, v in module.named_children()]
    out: list[tuple[str, Any]] = []
    for kid_name, kid in kids:
        out.extend(_expand_without(kid_name, kid, target, no_split))
    return out


def clean_device_map(device_map: dict[str, DeviceKey], module_name: str = "") -> dict[str, DeviceKey]:
    """Merge entries: a prefix whose entries (more than one) all share a device becomes one entry. Linear time.

    Args:
        device_map: Module name -> device (`"cpu"`, `"disk"`, an index or a `torch.device`); `""` names the
            whole model.
        module_name: Name of `module` in the model (the prefix of its weights' names).
    """
    # trie of dotted names; each node: (children in order, own value present?, uniform device or sentinel, count)
    mixed = object()
    root: dict[str, Any] = {"kids": {}, "value": None, "has": False}
    for key, value in device_map.items():
        node = root
        if key:
            for part in key.split("."):
                node = node["kids"].setdefault(part, {"kids": {}, "value": None, "has": False})
        node["has"], node["value"] = True, value

    def summarize(node: dict[str, Any]) -> tuple[Any, int]:
        device, count = (node["value"], 1) if node["has"] else (None, 0)
        for kid in node["kids"].values():
            kid_device, kid_count = summarize(kid)
            if kid_count == 0:
                continue
            if count == 0:
                device = kid_device
            elif device is mixed or kid_device is mixed or str(device) != str(kid_device):
                device = mixed
            count += kid_count
        node["device"], node["count"] = device, count
        return device, count

    import sys

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10000))
    try:
        summarize(root)
    finally:
        sys.setrecursionlimit(limit)

    start = root
    if module_name:
        for part in module_name.split("."):
            start = start["kids"].get(part)
            if start is None:
                return dict(device_map)
    result: dict[str, DeviceKey] = {
        k: v
        for k, v in device_map.items()
        if not (module_name == "" or k == module_name or k.startswith(module_name + "."))
    }
    stack: list[tuple[str, dict[str, Any]]] = [(module_name, start)]
    while stack:
        name, node = stack.pop()
        if node["count"] > 1 and node["device"] is not mixed:
            result[name] = node["device"]
            continue
        if node["has"]:
            result[name] = node["value"]
        for part, kid in reversed(list(node["kids"].items())):
            stack.append((f"{name}.{part}" if name else part, kid))
    return result


def check_device_map(model: nn.Module, device_map: Mapping[str, Any]) -> None:
    """Error when ``device_map`` misses some of the model's tensors or names modules the model does not have.

    Args:
        model: The model (an `nn.Module`).
        device_map: Module name -> device (`"cpu"`, `"disk"`, an index or a `torch.device`); `""` names the
            whole model.
    """
    if len(device_map) == 1 and "" in device_map:
        return
    tensor_names = [n for n, _, _ in iter_module_tensors(model)]
    known = {n for n, _ in model.named_modules()} | set(tensor_names)
    invented = [k for k in device_map if k not in known]
    if invented:
        raise ValueError(
            f"The device_map names modules the model does not have: {invented[:20]}"
            f"{' ...' if len(invented) > 20 else ''}. Top-level modules of the model: "
            f"{[n for n, _ in model.named_children()]}."
        )
    if "" in device_map:
        return
    missing = []
    for name in tensor_names:
        probe = name
        while probe not in device_map:
            if "." not in probe:
                missing.append(name)
                break
            probe = probe.rpartition(".")[0]
    if missing:
        raise ValueError(
            f"The device_map does not cover these parameters or buffers: {missing[:20]}"
            f"{' ...' if len(missing) > 20 else ''}. Add their modules (or a parent) to the map."
        )


def get_balanced_memory(
    model: nn.Module,
    max_memory: Mapping[Any, int | str] | None = None,
    no_split_module_classes: list[str] | str | None = None,
    dtype: str | torch.dtype | None = None,
    special_dtypes: dict[str, str | torch.dtype] | None = None,
    low_zero: bool = False,
) -> dict[DeviceKey, int]:
    """Budgets that spread the model evenly over the accelerators (all but the first with ``low_zero``).

    Without accelerators in ``max_memory`` it is returned unchanged (in bytes).

    Args:
        model: The model (an `nn.Module`).
        max_memory: Device -> memory budget (an int of bytes or text such as `"10GiB"`); `None` uses what is
            free.
        no_split_module_classes: Class names of modules that must stay whole on one device (for example a
            transformer block).
        dtype: The dtype the weights will have (sizes are computed and weights converted with it); `None`
            keeps each tensor's own.
        special_dtypes: Parameter name -> dtype, for weights that keep a dtype other than `dtype`.
        low_zero: Leave the first accelerator as empty as possible (for `generate`, which uses it for
            outputs).
    """
    if max_memory is None:
        from accel_bigmodel.device_memory import get_max_memory

        max_memory = get_max_memory()
    budgets = normalize_max_memory(max_memory)
    accelerators = sorted(d for d, m in budgets.items() if isinstance(d, int) and m > 0)
    if not accelerators:
        return budgets
    if len(accelerators) == 1:
        low_zero = False
    no_split = _check_no_split(model, no_split_module_classes)
    sizes = compute_module_sizes(model, dtype=dtype, special_dtypes=special_dtypes)
    per_device = sizes[""] // (len(accelerators) - 1 if low_zero else len(accelerators))

    buffer = 0
    if no_split:
        wanted = set(no_split)
        for name, module in model.named_modules():
            if type(module).__name__ in wanted:
                buffer = max(buffer, sizes.get(name, 0))
                wanted.discard(type(module).__name__)
                if not wanted:
                    break
    modules_only = {n: s for n, s in sizes.items() if n not in set(get_module_leaves(sizes))}
    leaves = get_module_leaves(modules_only)
    mean_leaf = int(sum(modules_only[n] for n in leaves) / max(len(leaves), 1))
    per_device += int(1.25 * max(buffer, mean_leaf))

    for index in accelerators[:-1]:
        cap = budgets[accelerators[0]] if (low_zero and index == accelerators[0]) else per_device
        budgets[index] = min(cap, budgets[index])
    if low_zero:
        others = sum(budgets[i] for i in accelerators[1:])
        budgets[accelerators[0]] = min(max(0, sizes[""] - others), budgets[accelerators[0]])
    return budgets


def device_for(name: str, device_map: Mapping[str, Any]) -> Any:
    """Device of tensor or module ``name``: the entry of its longest prefix in ``device_map`` (None if none)."""
    probe = name
    while True:
        if probe in device_map:
            return device_map[probe]
        if not probe:
            return None
        probe = probe.rpartition(".")[0] if "." in probe else ""
