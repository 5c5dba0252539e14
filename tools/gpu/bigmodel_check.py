"""Big-model loading onto a GPU: accel against the reference ``accelerate`` and raw safetensors.

    python tools/gpu/bigmodel_check.py [--blocks 24] [--width 4096]

Writes a sharded safetensors checkpoint of an MLP (``blocks`` Linear layers of ``width``², fp16), then:

1. ``load_checkpoint_and_dispatch(device_map={"": 0})`` with accel and with the reference, against
   ``safetensors.torch.load_file(device="cuda")`` + ``load_state_dict(assign=True)`` driven by hand;
2. ``device_map="auto"`` with a ``max_memory`` that keeps a third of the layers on the GPU, so the rest
   runs from CPU through the offload hooks: the output must equal the model fully on the GPU.

Prints one JSON line with the times, the ratios and the largest output difference.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import torch


def build(blocks: int, width: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(*(torch.nn.Linear(width, width, bias=False) for _ in range(blocks))).half()


def empty(framework: str, blocks: int, width: int) -> torch.nn.Module:
    if framework == "accel":
        from accel import init_empty_weights
    else:
        from accelerate import init_empty_weights
    with init_empty_weights():
        return torch.nn.Sequential(*(torch.nn.Linear(width, width, bias=False) for _ in range(blocks))).half()


def dispatch(framework: str, folder: str, blocks: int, width: int, **kwargs: object) -> torch.nn.Module:
    if framework == "accel":
        from accel import load_checkpoint_and_dispatch
    else:
        from accelerate import load_checkpoint_and_dispatch
    return load_checkpoint_and_dispatch(empty(framework, blocks, width), folder, **kwargs)


def timed(fn) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    model = fn()
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    del model
    torch.cuda.empty_cache()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=24)
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    from safetensors.torch import load_file, save_file

    folder = tempfile.mkdtemp(prefix="gpu-bigmodel-")
    model = build(args.blocks, args.width)
    state = model.state_dict()
    keys = list(state)
    half = len(keys) // 2
    shards = {"model-00001-of-00002.safetensors": keys[:half], "model-00002-of-00002.safetensors": keys[half:]}
    weight_map = {}
    for name, shard_keys in shards.items():
        save_file({k: state[k].contiguous() for k in shard_keys}, os.path.join(folder, name))
        weight_map.update(dict.fromkeys(shard_keys, name))
    size = sum(v.numel() * v.element_size() for v in state.values())
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as file:
        json.dump({"metadata": {"total_size": size}, "weight_map": weight_map}, file)

    def raw() -> torch.nn.Module:
        target = empty("accel", args.blocks, args.width)
        loaded = {}
        for name in shards:
            loaded.update(load_file(os.path.join(folder, name), device="cuda"))
        target.load_state_dict(loaded, assign=True)
        return target

    frameworks = ["accel"]
    try:
        import accelerate  # noqa: F401

        frameworks.append("accelerate")
    except ImportError:
        pass
    runs = {"raw": raw}
    for framework in frameworks:
        runs[framework] = lambda f=framework: dispatch(f, folder, args.blocks, args.width, device_map={"": 0})
    for fn in runs.values():
        timed(fn)  # warm page cache and CUDA context
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.repeat):
        for name, fn in runs.items():
            times[name].append(timed(fn))
    result: dict[str, object] = {"gib": size / 2**30}
    for name in runs:
        result[f"{name}_s"] = statistics.median(times[name])
    result["accel_over_raw"] = result["accel_s"] / result["raw_s"]
    if "accelerate" in runs:
        result["accel_over_reference"] = result["accel_s"] / result["accelerate_s"]

    # offload: a third of the layers on the GPU, the rest on CPU through hooks
    reference_model = model.cuda()
    x = torch.randn(8, args.width, device="cuda", dtype=torch.float16)
    with torch.no_grad():
        expected = reference_model(x)
    del reference_model
    torch.cuda.empty_cache()
    budget = size // 3
    for framework in frameworks:
        dispatched = dispatch(
            framework, folder, args.blocks, args.width, device_map="auto", max_memory={0: budget, "cpu": size * 2}
        )
        placed = {str(p.device) for p in dispatched.parameters()}
        with torch.no_grad():
            out = dispatched(x)
        result[f"{framework}_offload_max_diff"] = float((out.float() - expected.float()).abs().max())
        result[f"{framework}_offload_devices"] = sorted(placed)
        result[f"{framework}_offload_map"] = sorted(set(map(str, getattr(dispatched, "hf_device_map", {}).values())))
        del dispatched
        torch.cuda.empty_cache()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
