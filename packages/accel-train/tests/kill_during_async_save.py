"""Driver of the SIGKILL test of an asynchronous save (run as a fresh interpreter, never forked).

Saves a checkpoint of parameters all 1.0 into ``<work folder>/ckpt``, sets them to 2.0, starts an
asynchronous save over the same folder and keeps training; the background writer kills this process with
SIGKILL right after it has written the first file of the new save. The test then checks that the folder
still loads as the first save and that no partial folder is visible.

Usage: ``python kill_during_async_save.py <work folder>``.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import torch


def main(work: str) -> None:
    from accel_train import Accelerator
    from accel_train.checkpoint import file_io

    folder = os.path.join(work, "ckpt")
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
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
    main(sys.argv[1])
