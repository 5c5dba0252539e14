"""save_state / load_state of a ~500 MB model with its AdamW state, against plain torch.save / torch.load
and against the reference ``accelerate`` release.

    .venv/bin/python tools/bench/checkpoint.py [--repeats 5] [--no-reference]

Each framework runs in its own process (accel here, the reference in ``.venv-reference``); both also
time ``torch.save`` / ``torch.load`` of the same model and optimizer state dicts in that process, so the
ratios compare like with like. accel's checkpoint is written to a temporary folder and renamed into
place, and loaded without unpickling; the reference writes in place and unpickles its RNG states.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def worker(framework: str, repeats: int, folder: str) -> None:
    import torch

    torch.set_num_threads(2)
    if framework == "accel":
        from accel_train import Accelerator
    else:
        from accelerate import Accelerator
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(8)])  # 134 M parameters, 537 MB
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer = accelerator.prepare(model, optimizer)
    model(torch.randn(2, 4096)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    size = sum(p.numel() * p.element_size() for p in model.parameters())

    saves, loads, plain_saves, plain_loads = [], [], [], []

    def plain_save(path: str) -> None:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)

    def plain_load(path: str) -> None:
        state = torch.load(path, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])

    for index in range(repeats):
        target = os.path.join(folder, f"state_{index}")
        saves.append(_timed(accelerator.save_state, target))
        loads.append(_timed(accelerator.load_state, target))
        shutil.rmtree(target)
        plain = os.path.join(folder, f"plain_{index}.pt")
        plain_saves.append(_timed(plain_save, plain))
        plain_loads.append(_timed(plain_load, plain))
        os.remove(plain)
    print(
        json.dumps(
            {
                "model_mb": size / 2**20,
                "save": statistics.median(saves),
                "load": statistics.median(loads),
                "torch_save": statistics.median(plain_saves),
                "torch_load": statistics.median(plain_loads),
            }
        )
    )


def _run(python: str, framework: str, repeats: int) -> dict:
    folder = tempfile.mkdtemp(prefix=f"ckpt_bench_{framework}_")
    try:
        command = [python, __file__, "--worker", framework, str(repeats), folder]
        env = {**os.environ, "OMP_NUM_THREADS": "2"}
        result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
        return json.loads([line for line in result.stdout.splitlines() if line.startswith("{")][-1])
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    sys.path.insert(0, HERE)
    from _common import ratio_line, reference_python, this_python

    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-reference", action="store_true")
    options = parser.parse_args()
    rows = [("accel", _run(this_python(), "accel", options.repeats))]
    reference = None if options.no_reference else reference_python()
    if reference is not None:
        rows.append(("reference", _run(reference, "reference", options.repeats)))
    print(
        f"save_state / load_state of a {rows[0][1]['model_mb']:.0f} MB model + AdamW state (median of {options.repeats})"
    )
    print(
        f"{'':<12} {'save_state':>10} {'torch.save':>10} {'ratio':>6}   {'load_state':>10} {'torch.load':>10} {'ratio':>6}"
    )
    for name, row in rows:
        prefix = "" if name == "accel" else "reference: "
        ratio_line(f"{prefix}save_state / torch.save", row["save"], row["torch_save"])
        ratio_line(f"{prefix}load_state / torch.load", row["load"], row["torch_load"])
        print(
            f"{name:<12} {row['save']:9.3f}s {row['torch_save']:9.3f}s {row['torch_save'] / row['save']:6.2f}   "
            f"{row['load']:9.3f}s {row['torch_load']:9.3f}s {row['torch_load'] / row['load']:6.2f}"
        )
    if len(rows) == 2:
        ours, ref = rows[0][1], rows[1][1]
        ratio_line("accel vs reference: save_state", ours["save"], ref["save"], goal="<= 1.00")
        ratio_line("accel vs reference: load_state", ours["load"], ref["load"], goal="<= 1.00")
        print(
            f"accel / reference time: save {ours['save'] / ref['save']:.2f}, load {ours['load'] / ref['load']:.2f} (goal <= 1.00)"
        )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    else:
        main()
