"""accel-train installed alone: 2 processes (DDP on CPU) train, save_state, load_state and save_model."""

from __future__ import annotations

import os
import sys
import tempfile

from _common import check, installed_distributions, under_torchrun


def worker() -> None:
    import torch

    from accel_state.operations import broadcast_object_list
    from accel_train import Accelerator

    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    check(accelerator.num_processes == 2, f"expected 2 processes, got {accelerator.num_processes}")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for inputs, targets in loader:
        with accelerator.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(inputs), targets)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    folder = broadcast_object_list([tempfile.mkdtemp(prefix="accel-train-smoke-")])[0]
    accelerator.save_state(os.path.join(folder, "state"))
    trained = [p.detach().clone() for p in accelerator.unwrap_model(model).parameters()]
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    accelerator.load_state(os.path.join(folder, "state"))
    restored = all(torch.equal(a, b) for a, b in zip(trained, accelerator.unwrap_model(model).parameters()))
    check(restored, "load_state did not restore the trained parameters")
    accelerator.save_model(model, os.path.join(folder, "model"))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        check(
            os.path.isfile(os.path.join(folder, "model", "model.safetensors")), "save_model wrote no model.safetensors"
        )
        print("accel-train smoke: 2-process training, save_state / load_state, save_model OK")


if __name__ == "__main__":
    if "--worker" not in sys.argv:
        print("installed:", ", ".join(installed_distributions()))
    if under_torchrun(__file__):
        worker()
