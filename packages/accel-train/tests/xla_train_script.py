"""The script of issue 39, as a new user writes it: ``Accelerator()``, a small MLP, SGD, a ``DataLoader``,
8 steps, ``save_state``, a change to the weights, ``load_state``. ``python xla_train_script.py OUT [--cpu]``
prints one JSON line: the distributed type, the device, the losses and whether the reload was exact.
`run()` is the same script as a function, for in-process use."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset


def run(out: str, cpu: bool = False, **accelerator_kwargs: Any) -> dict[str, Any]:
    """Train 8 steps, save, perturb, load; what happened, as plain values."""
    from accel_state.random import set_seed
    from accel_train import Accelerator

    set_seed(0)
    accelerator = Accelerator(cpu=cpu, **accelerator_kwargs)
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 8, generator=generator), torch.randn(64, 1, generator=generator)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(x, y), batch_size=8)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for xb, yb in loader:
        with accelerator.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
        losses.append(loss.item())
    folder = os.path.join(out, "checkpoint")
    accelerator.save_state(folder)
    saved = {k: v.detach().cpu().clone() for k, v in accelerator.unwrap_model(model).state_dict().items()}
    with torch.no_grad():
        for param in model.parameters():
            param.add_(1.0)
    accelerator.load_state(folder)
    back = {k: v.detach().cpu() for k, v in accelerator.unwrap_model(model).state_dict().items()}
    return {
        "distributed_type": accelerator.distributed_type.value,
        "device": str(accelerator.device),
        "losses": losses,
        "exact": all(torch.equal(saved[k], back[k]) for k in saved),
        "folder": folder,
    }


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1], cpu="--cpu" in sys.argv[2:])))
