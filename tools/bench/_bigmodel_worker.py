"""Worker of the bigmodel benchmarks: runs one measurement with accel or the reference and prints JSON.

Run by tools/bench/bigmodel_*.py with this interpreter (accel) or the reference venv's (accelerate);
checkpoints are made under /tmp by the caller, never in the repository.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import time
from typing import Any

import torch
from torch import nn


def lib(name: str) -> Any:
    if name == "accel":
        import accel_bigmodel as module

        return module
    import accelerate
    import accelerate.utils

    class Ref:
        init_empty_weights = accelerate.init_empty_weights
        load_checkpoint_and_dispatch = accelerate.load_checkpoint_and_dispatch
        disk_offload = accelerate.disk_offload
        infer_auto_device_map = accelerate.infer_auto_device_map

    return Ref


class Wide(nn.Module):
    """``count`` linear layers of ``width`` x ``width`` (no bias) in groups of 100, applied in order.

    Groups keep torch's own ``load_state_dict`` (whose per-module key filtering is quadratic in the
    number of siblings) a fair baseline.
    """

    def __init__(self, count: int, width: int):
        super().__init__()
        groups = [min(100, count - start) for start in range(0, count, 100)]
        self.groups = nn.ModuleList(
            [nn.Sequential(*[nn.Linear(width, width, bias=False) for _ in range(n)]) for n in groups]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for group in self.groups:
            x = group(x)
        return x


SHAPES = {"large": (32, 4096), "small": (20000, 50)}  # ~2 GB of 64 MB tensors; ~200 MB of 10 KB tensors


def shape(kind: str, scale: float) -> tuple[int, int]:
    count, width = SHAPES[kind]
    return max(2, int(count * scale)), width


def make(args: argparse.Namespace) -> dict[str, Any]:
    from accel_bigmodel.sharding import save_sharded

    count, width = shape(args.kind, args.scale)
    torch.manual_seed(0)
    model = Wide(count, width)
    for p in model.parameters():
        p.data.mul_(1.0 / width**0.5 * 4)
    if os.path.isdir(args.path):
        shutil.rmtree(args.path)
    save_sharded(model.state_dict(), args.path, max_shard_size="512MB")
    return {"files": len(os.listdir(args.path))}


def _touch(model: nn.Module) -> float:
    total = 0.0
    for p in model.parameters():
        if p.device.type != "meta":
            total += float(p.detach().float().sum())
    return total


def load(args: argparse.Namespace) -> dict[str, Any]:
    count, width = shape(args.kind, args.scale)
    times = []
    module = lib(args.lib) if args.mode != "plain" else None
    for _ in range(args.repeat + 1):
        if module is None:
            with torch.device("meta"):
                model = Wide(count, width)
        else:
            with module.init_empty_weights():
                model = Wide(count, width)
        start = time.perf_counter()
        if args.mode == "plain":
            from safetensors.torch import load_file

            state = {}
            for name in sorted(os.listdir(args.path)):
                if name.endswith(".safetensors"):
                    state.update(load_file(os.path.join(args.path, name)))
            model.load_state_dict(state, assign=True)
            del state
        else:
            assert module is not None
            kwargs: dict[str, Any] = {"device_map": {"": "cpu"}}
            if args.mode == "offload":
                offload = args.path.rstrip("/") + f"-offload-{args.lib}"
                total = count * width * width * 4
                kwargs = {"device_map": "auto", "max_memory": {"cpu": total // 2}, "offload_folder": offload}
            model = module.load_checkpoint_and_dispatch(model, args.path, **kwargs)
        _touch(model)
        times.append(time.perf_counter() - start)
        del model
        if args.mode == "offload":
            shutil.rmtree(offload, ignore_errors=True)
    return {"seconds": statistics.median(times[1:])}


def _warm_cache(folder: str) -> None:
    """Read every file of ``folder`` once, so the timed loads find it in the page cache."""
    for name in os.listdir(folder):
        with open(os.path.join(folder, name), "rb") as f:
            while f.read(1 << 24):
                pass


def warm(args: argparse.Namespace) -> dict[str, Any]:
    """Warm-cache load to the CPU, plain and library alternating in one process.

    Each round times the call alone and the call plus a first read of every weight, for plain
    ``safetensors.torch.load_file`` + ``load_state_dict(assign=True)`` and for
    ``load_checkpoint_and_dispatch(device_map={"": "cpu"})``. Returns the medians and the median of
    the per-round ratios (the machine's load changes between rounds, less within one).
    """
    from safetensors.torch import load_file

    count, width = shape(args.kind, args.scale)
    module = lib(args.lib)
    _warm_cache(args.path)

    def plain() -> tuple[float, float]:
        with torch.device("meta"):
            model = Wide(count, width)
        start = time.perf_counter()
        state: dict[str, torch.Tensor] = {}
        for name in sorted(os.listdir(args.path)):
            if name.endswith(".safetensors"):
                state.update(load_file(os.path.join(args.path, name)))
        model.load_state_dict(state, assign=True)
        del state
        call = time.perf_counter() - start
        _touch(model)
        return call, time.perf_counter() - start

    def ours() -> tuple[float, float]:
        with module.init_empty_weights():
            model = Wide(count, width)
        start = time.perf_counter()
        model = module.load_checkpoint_and_dispatch(model, args.path, device_map={"": "cpu"})
        call = time.perf_counter() - start
        _touch(model)
        return call, time.perf_counter() - start

    plain(), ours()  # warm-up: imports, first maps
    rounds = []
    for i in range(args.repeat):
        pair = (plain(), ours()) if i % 2 == 0 else tuple(reversed((ours(), plain())))
        rounds.append(pair)
    med = statistics.median
    return {
        "plain_call": med(r[0][0] for r in rounds),
        "plain_touch": med(r[0][1] for r in rounds),
        "lib_call": med(r[1][0] for r in rounds),
        "lib_touch": med(r[1][1] for r in rounds),
        "ratio_call": med(r[1][0] / r[0][0] for r in rounds),
        "ratio_touch": med(r[1][1] / r[0][1] for r in rounds),
    }


def devmap(args: argparse.Namespace) -> dict[str, Any]:
    module = lib(args.lib)
    with module.init_empty_weights():
        model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(args.n)])
    if args.tied:
        # Layer i shares its weight with layer i + n/2: every placement of the first half also places a
        # module far ahead, which the largest-layer reserve must then forget.
        half = args.n // 2
        for i in range(half):
            model[i + half].weight = model[i].weight
    budget = {"cpu": args.n * (8 * 8 + 8) * 4 // 2}
    times = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        if args.mode == "plain":
            _plain_greedy(model, budget["cpu"])
        else:
            module.infer_auto_device_map(model, max_memory=dict(budget))
        times.append(time.perf_counter() - start)
    return {"seconds": statistics.median(times)}


def _plain_greedy(model: nn.Module, budget: int) -> dict[str, str]:
    """What a hand-written planner does: sizes per top-level module, then fill the CPU, then the disk."""
    sizes: dict[str, int] = {}
    for name, param in model.named_parameters():
        top = name.split(".", 1)[0]
        sizes[top] = sizes.get(top, 0) + param.numel() * param.element_size()
    used, device_map = 0, {}
    largest = max(sizes.values())
    for name in sizes:
        if used + sizes[name] <= budget - largest:
            device_map[name], used = "cpu", used + sizes[name]
        else:
            device_map[name] = "disk"
    return device_map


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _forward_seconds(model: Any, x: Any, repeat: int) -> tuple[Any, float]:
    """The output of one untimed forward (which also warms up), and the mean seconds of ``repeat`` more."""
    import torch

    with torch.no_grad():
        out = model(x)
        start = time.perf_counter()
        for _ in range(repeat):
            model(x)
    return out, (time.perf_counter() - start) / repeat


def forward(args: argparse.Namespace) -> dict[str, Any]:
    count, width = (8, 4096) if args.kind == "large" else (10000, 32)
    count = max(2, int(count * args.scale))
    batch = 64 if args.kind == "large" else 16
    torch.manual_seed(0)
    x = torch.randn(batch, width)
    folder = args.path
    result: dict[str, Any] = {}
    if args.mode == "memory":
        torch.manual_seed(1)
        model = Wide(count, width).eval()
        out, result["seconds"] = _forward_seconds(model, x, args.repeat)
        torch.save(out, folder + ".expected.pt")
        torch.save(model.state_dict(), folder + ".state.pt")
        return result
    module = lib(args.lib)
    folder = f"{folder}-{args.lib}"
    if args.mode == "prepare":  # each library writes its own offload folder (not timed)
        model = Wide(count, width).eval()
        model.load_state_dict(torch.load(args.path + ".state.pt", weights_only=True))
        module.disk_offload(model, folder, execution_device="cpu")
        return {"prepared": folder}
    with module.init_empty_weights():
        model = Wide(count, width).eval()
    base = _rss()
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    module.disk_offload(model, folder, execution_device="cpu")
    out, result["seconds"] = _forward_seconds(model, x, args.repeat)
    expected = torch.load(args.path + ".expected.pt", weights_only=True)
    result["equal"] = bool(torch.equal(out, expected))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    result["extra_peak_bytes"] = max(0, peak - max(base, peak_before))
    result["block_bytes"] = width * width * 4
    result["model_bytes"] = count * width * width * 4
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("task", choices=["make", "load", "warm", "devmap", "forward"])
    parser.add_argument("--lib", default="accel")
    parser.add_argument("--mode", default="lib")
    parser.add_argument("--kind", default="large")
    parser.add_argument("--path", default="")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--tied", action="store_true", help="devmap: tie the two halves of the model")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    result = {"make": make, "load": load, "warm": warm, "devmap": devmap, "forward": forward}[args.task](args)
    sys.stdout.flush()
    print(json.dumps(result))


if __name__ == "__main__":
    import warnings

    warnings.simplefilter("ignore")
    main()
