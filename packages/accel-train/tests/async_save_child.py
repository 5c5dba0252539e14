"""Driver of the asynchronous-save tests that need a process of their own (a fresh interpreter, never forked).

``kill``: saves a checkpoint of parameters all 1.0 into ``<work folder>/ckpt``, sets them to 2.0, starts
an asynchronous save over the same folder and keeps training; the background writer kills this process
with SIGKILL right after it has written the first file of the new save. The test then checks that the
folder still loads as the first save and that no partial folder is visible.

``exit``: starts an asynchronous save of parameters all 3.0 into ``<work folder>/ckpt`` and returns from
the script at once; the write is held until the interpreter has begun to shut down (the main thread has
ended), so the folder is complete afterwards only if exit waited for it.

Usage: ``python async_save_child.py <work folder> kill|exit``.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

import torch


def _prepared() -> tuple[Any, Any, Any]:
    from accel_train import Accelerator

    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    return accelerator, model, optimizer


def exit_during_the_write(work: str) -> None:
    from accel_train.checkpoint import file_io

    accelerator, model, _ = _prepared()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.fill_(3.0)
    shutting_down = threading.Event()

    def watch_main() -> None:
        threading.main_thread().join()  # returns once the interpreter has begun to shut down
        shutting_down.set()

    threading.Thread(target=watch_main, daemon=True).start()
    original = file_io.save_weights

    def held(state_dict: Any, path: str, *args: Any) -> None:
        shutting_down.wait()
        original(state_dict, path, *args)

    file_io.save_weights = held
    accelerator.save_state(os.path.join(work, "ckpt"), async_save=True)
    print("returned before the write", flush=True)


def main(work: str) -> None:
    from accel_train.checkpoint import file_io

    folder = os.path.join(work, "ckpt")
    accelerator, model, optimizer = _prepared()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.fill_(1.0)
    accelerator.save_state(folder)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.fill_(2.0)
    original = file_io.save_weights

    def write_then_die(state_dict: Any, path: str, *args: Any) -> None:
        original(state_dict, path, *args)
        print("written while training", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    file_io.save_weights = write_then_die
    accelerator.save_state(folder, async_save=True)
    while True:  # training goes on until the writer's kill
        loss = model(torch.randn(8, 4)).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()


if __name__ == "__main__":
    if sys.argv[2] == "exit":
        exit_during_the_write(sys.argv[1])
    else:
        main(sys.argv[1])
