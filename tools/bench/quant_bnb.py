"""Benchmark: bitsandbytes quantization with accel-quant on CPU: memory and loading time.

Model: a GPT-like stack (width 768, 12 blocks of q/k/v/o + a 4x MLP, vocabulary 2048, output head
kept unquantized as by default): 87M parameters, 349 MB in fp32. Prints

* bytes of parameters and buffers (quantization statistics included) of the quantized model against
  the fp32 model, with the unquantized parts in fp16 (``torch_dtype=torch.float16``, as bitsandbytes
  recommends) and in fp32: goals 8-bit <= 0.3 and 4-bit NF4 <= 0.17 (with fp16 for the rest);
* time of ``load_and_quantize_model`` from a safetensors checkpoint against loading the fp32 model
  (meta model + ``safetensors.torch.load_file`` + ``load_state_dict(assign=True)``) and converting its
  Linear layers with bitsandbytes' own classes by hand: goal <= 1.1. Each load runs in a fresh process
  (one warm-up load, then the timed one); the two sides alternate ``--repeat`` times and the medians
  are compared. Nearly all of the time is bitsandbytes' own quantization kernel.

The reference ``accelerate`` needs a GPU for ``load_and_quantize_model`` ("No GPU found"), so it is
not timed here.

    .venv/bin/python tools/bench/quant_bnb.py [--repeat 5] [--width 768] [--blocks 12] [--kinds nf4]

The nf4 timing checks that the loaded weights really are nf4 (a run that got fp4 stops with an error).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from _common import median_seconds, ratio_line, run_json, skipped_without, this_python


def build_model(width: int, blocks: int, vocab: int):  # type: ignore[no-untyped-def]
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1 = nn.LayerNorm(width)
            self.q, self.k, self.v, self.o = (nn.Linear(width, width) for _ in range(4))
            self.ln2 = nn.LayerNorm(width)
            self.up = nn.Linear(width, 4 * width)
            self.down = nn.Linear(4 * width, width)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.ln1(x)
            x = x + self.o(self.q(h) + self.k(h) + self.v(h))
            return x + self.down(torch.nn.functional.gelu(self.up(self.ln2(x))))

    class GPTLike(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, width)
            self.blocks = nn.ModuleList([Block() for _ in range(blocks)])
            self.norm = nn.LayerNorm(width)
            self.head = nn.Linear(width, vocab)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            h = self.embed(tokens)
            for block in self.blocks:
                h = block(h)
            return self.head(self.norm(h))

    return GPTLike()


def _config(kind: str, fp16_rest: bool):  # type: ignore[no-untyped-def]
    import torch

    from accel_quant.bnb_config import BnbQuantizationConfig

    rest = torch.float16 if fp16_rest else None
    if kind == "8bit":
        return BnbQuantizationConfig(load_in_8bit=True, torch_dtype=rest)
    return BnbQuantizationConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float16, torch_dtype=rest
    )


def worker(args: argparse.Namespace) -> None:
    import torch

    shape = (args.width, args.blocks, args.vocab)
    path = os.path.join(args.path, "model.safetensors")
    if args.mode == "make":
        from safetensors.torch import save_file

        torch.manual_seed(0)
        save_file(build_model(*shape).state_dict(), path)
        print(json.dumps({"ok": True}))
        return
    from accel_bigmodel.empty import init_empty_weights
    from accel_quant.bnb import load_and_quantize_model, quantized_model_bytes

    if args.mode == "memory":
        fp32 = quantized_model_bytes(build_model(*shape))
        out = {"fp32": fp32}
        for kind in ("8bit", "nf4"):
            for fp16_rest in (True, False):
                with init_empty_weights():
                    empty = build_model(*shape)
                model = load_and_quantize_model(empty, _config(kind, fp16_rest), weights_location=args.path)
                out[f"{kind}-{'fp16' if fp16_rest else 'fp32'}"] = quantized_model_bytes(model)
        print(json.dumps(out))
        return

    def ours() -> None:
        with init_empty_weights():
            empty = build_model(*shape)
        model = load_and_quantize_model(empty, _config(args.kind, False), weights_location=args.path)
        if args.kind == "nf4":  # time what was asked for: nf4 really applied, not fp4
            weights = [getattr(m, "weight", None) for m in model.modules()]
            found = {w.quant_state.quant_type for w in weights if getattr(w, "quant_state", None) is not None}
            if found != {"nf4"}:
                raise RuntimeError(f"load_and_quantize_model gave {found} weights, not nf4")

    def by_hand() -> None:
        import bitsandbytes as bnb
        from safetensors.torch import load_file
        from torch import nn

        with torch.device("meta"):
            model = build_model(*shape)
        model.load_state_dict(load_file(path), assign=True)
        for name, module in list(model.named_modules()):
            if not isinstance(module, nn.Linear) or name == "head":
                continue
            if args.kind == "8bit":
                layer = bnb.nn.Linear8bitLt(
                    module.in_features, module.out_features, True, has_fp16_weights=False, threshold=6.0, device="meta"
                )
                layer.weight = bnb.nn.Int8Params(module.weight.data, requires_grad=False, has_fp16_weights=False)
            else:
                layer = bnb.nn.Linear4bit(
                    module.in_features,
                    module.out_features,
                    True,
                    torch.float16,
                    compress_statistics=False,
                    quant_type="nf4",
                    device="meta",
                )
                layer.weight = bnb.nn.Params4bit(
                    module.weight.data, requires_grad=False, compress_statistics=False, quant_type="nf4", module=layer
                )
            layer.bias = nn.Parameter(module.bias.data, requires_grad=False)
            layer.weight = layer.weight.to("cpu")  # bitsandbytes quantizes on the move to a device
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, layer)

    fn = ours if args.mode == "ours" else by_hand
    print(json.dumps({"seconds": median_seconds(fn, repeat=args.repeat, warmup=1)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--blocks", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--worker", choices=("make", "memory", "ours", "by_hand"), default=None)
    parser.add_argument("--kind", choices=("8bit", "nf4"), default="8bit")
    parser.add_argument("--path", default=None)
    parser.add_argument("--kinds", default="8bit,nf4", help="which load times to measure (comma-separated)")
    args = parser.parse_args()
    if args.worker is not None:
        args.mode = args.worker
        worker(args)
        return
    if skipped_without("bitsandbytes", hint='install "accel-quant[bnb]" or bitsandbytes'):
        return

    root = tempfile.mkdtemp(prefix="accel-bench-quant-")
    shape = ["--width", str(args.width), "--blocks", str(args.blocks), "--vocab", str(args.vocab), "--path", root]
    me, script = this_python(), os.path.abspath(__file__)
    try:
        run_json(me, script, "--worker", "make", *shape)
        sizes = run_json(me, script, "--worker", "memory", *shape)
        print(
            f"model: width {args.width}, {args.blocks} blocks, vocabulary {args.vocab}; fp32 {sizes['fp32'] / 2**20:.1f} MiB"
        )
        print("\nbytes of parameters and buffers, quantized vs fp32")
        for key, goal in (("8bit-fp16", "<= 0.3"), ("nf4-fp16", "<= 0.17"), ("8bit-fp32", ""), ("nf4-fp32", "")):
            kind, rest = key.split("-")
            label = f"{kind}, unquantized parts in {rest}"
            print(ratio_line(label, sizes[key] / 2**20, sizes["fp32"] / 2**20, unit="MiB", goal=goal))
        print(f"\nload time from safetensors, median of {args.repeat} alternating runs (fresh process each)")
        for kind in args.kinds.split(","):
            timing = ["--kind", kind, "--repeat", "1"]
            ours, hand = [], []
            for _ in range(args.repeat):  # alternate, so a change of machine load hits both sides alike
                ours.append(run_json(me, script, "--worker", "ours", *shape, *timing)["seconds"])
                hand.append(run_json(me, script, "--worker", "by_hand", *shape, *timing)["seconds"])
            label = f"load_and_quantize_model ({kind}) vs fp32 load + bnb by hand"
            print(ratio_line(label, statistics.median(ours), statistics.median(hand), goal="<= 1.1"))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
