"""accel-data installed alone: a data loader sharded over 2 processes, each sample read once, then gathered."""

from __future__ import annotations

import sys

from _common import check, installed_distributions, under_torchrun


def worker() -> None:
    import torch

    from accel_data import prepare_data_loader, skip_first_batches
    from accel_state import PartialState
    from accel_state.operations import gather_object

    state = PartialState(cpu=True)
    dataset = torch.utils.data.TensorDataset(torch.arange(40))
    loader = prepare_data_loader(torch.utils.data.DataLoader(dataset, batch_size=4, shuffle=True))
    seen = [int(x) for (batch,) in loader for x in batch]
    everyone = sorted(x for part in gather_object([seen]) for x in part)
    check(everyone == list(range(40)), f"the two processes read {everyone}")
    ordered = prepare_data_loader(torch.utils.data.DataLoader(dataset, batch_size=4))
    full = [int(x) for (batch,) in ordered for x in batch]
    resumed = [int(x) for (batch,) in skip_first_batches(ordered, 2) for x in batch]
    check(resumed == full[8:], f"skip_first_batches(2) read {resumed}, expected {full[8:]}")
    if state.is_main_process:
        print("accel-data smoke: 40 samples sharded over 2 processes, each read once; skip_first_batches OK")


if __name__ == "__main__":
    if "--worker" not in sys.argv:
        print("installed:", ", ".join(installed_distributions()))
    if under_torchrun(__file__):
        worker()
