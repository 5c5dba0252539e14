"""What libraries built on the documented system call (TRL, issue 25): ``gather_for_metrics`` on a
0-dim value at the last short batch, and ``accel.utils.fsdp_utils.get_parameters_from_modules``."""

from __future__ import annotations

import pytest
import torch


def test_gather_for_metrics_returns_a_0_dim_value_unchanged_on_the_last_short_batch() -> None:
    from accel_train import Accelerator

    accelerator = Accelerator(cpu=True)
    loader = accelerator.prepare(torch.utils.data.DataLoader(torch.arange(5.0), batch_size=2))
    counts, cut = [], []
    for batch in loader:
        counts.append(accelerator.gather_for_metrics(torch.tensor(float(len(batch)))))  # 0-dim, as TRL's token count
        cut.append(accelerator.gather_for_metrics(batch))
    assert [c.ndim for c in counts] == [0, 0, 0] and [float(c) for c in counts] == [2.0, 2.0, 1.0]
    assert torch.cat(cut).tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_get_parameters_from_modules_by_modules_by_name_and_none() -> None:
    from accel_train.fsdp_utils import get_parameters_from_modules

    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))
    assert get_parameters_from_modules(None, model, "cpu") == set()
    by_module = get_parameters_from_modules([model[2]], model, "cpu")
    assert by_module == {model[2].weight, model[2].bias}
    by_name = get_parameters_from_modules("0|2", model, torch.device("cpu"))
    assert by_name == set(model.parameters())
    assert get_parameters_from_modules("nothing", model, "cpu") == set()  # no match: nothing, as documented


def test_get_parameters_from_modules_rejects_a_bad_expression() -> None:
    import re

    from accel_train.fsdp_utils import get_parameters_from_modules

    with pytest.raises(re.error):
        get_parameters_from_modules("(", torch.nn.Linear(1, 1), "cpu")
