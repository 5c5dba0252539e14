"""Per-call cost of a tracker's log(): accel vs the reference accelerate vs plain writing, interleaved in one process.

Needs tensorboard and the reference accelerate==1.15.0 in the same interpreter as accel, e.g.
    uv pip install "packages/accel-tracking[tensorboard]" accelerate==1.15.0   (pinned torch)
    python tools/bench/tracking_log.py
It says so and exits 0 when they are missing.
"""

import json
import os
import tempfile
import time

import torch

N = 2000
VALUES = [{"loss": torch.tensor(1.0 / (i + 1)), "lr": 1e-3, "acc": 0.5} for i in range(N)]


def as_numbers(values):
    return {k: (v.item() if hasattr(v, "item") else v) for k, v in values.items()}


def main() -> None:
    import importlib.util

    missing = [m for m in ("accelerate", "tensorboard") if importlib.util.find_spec(m) is None]
    if missing:
        print(f"tracking_log: skipped, needs {' and '.join(missing)} installed beside accel")
        return
    from accelerate.state import PartialState as RefState
    from accelerate.tracking import TensorBoardTracker as RefTB
    from torch.utils.tensorboard import SummaryWriter

    from accel_tracking import JSONLTracker, TensorBoardTracker, log_to_all

    RefState()
    root = tempfile.mkdtemp()
    plain_tb = SummaryWriter(os.path.join(root, "plain"))
    ours_tb = TensorBoardTracker("ours", root)
    ours_tb.start()
    ref_tb = RefTB("ref", root)
    ref_tb.start()
    raw = open(os.path.join(root, "raw.jsonl"), "w")  # noqa: SIM115
    ours_jsonl = JSONLTracker("ours", root)
    ours_jsonl.start()

    def plain_tb_run():
        for i in range(N):
            for k, v in as_numbers(VALUES[i]).items():
                plain_tb.add_scalar(k, v, global_step=i)
            plain_tb.flush()

    def ours_tb_run():
        for i in range(N):
            log_to_all([ours_tb], VALUES[i], step=i)

    def ref_tb_run():
        for i in range(N):
            ref_tb.log(as_numbers(VALUES[i]), step=i)

    def raw_jsonl_run():
        for i in range(N):
            record = {"event": "log", "step": i, "time": time.time(), "values": as_numbers(VALUES[i])}
            raw.write(json.dumps(record) + "\n")
            raw.flush()

    def ours_jsonl_run():
        for i in range(N):
            log_to_all([ours_jsonl], VALUES[i], step=i)

    runs = {
        "tensorboard plain SummaryWriter": plain_tb_run,
        "tensorboard accel": ours_tb_run,
        "tensorboard accelerate 1.15": ref_tb_run,
        "jsonl plain json.dumps": raw_jsonl_run,
        "jsonl accel": ours_jsonl_run,
    }
    best = {name: float("inf") for name in runs}
    for _ in range(5):
        for name, fn in runs.items():
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], (time.perf_counter() - start) / N * 1e6)
    for name, us in best.items():
        print(f"{name:34s} {us:8.1f} us per log call")
    print(f"tensorboard accel / plain      {best['tensorboard accel'] / best['tensorboard plain SummaryWriter']:.2f}x")
    print(f"tensorboard accel / accelerate {best['tensorboard accel'] / best['tensorboard accelerate 1.15']:.2f}x")
    print(f"jsonl accel / plain            {best['jsonl accel'] / best['jsonl plain json.dumps']:.2f}x")


if __name__ == "__main__":
    main()
