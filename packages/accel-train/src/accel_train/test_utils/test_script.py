"""Self-test of an accel installation under the current launch configuration (run by ``accel test``).

Each check prints ``PASS`` or ``FAIL`` with what it verified; the exit status is non-zero when any
check failed. Run it through ``accel launch`` so that it sees the configuration to verify.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import traceback
from collections.abc import Callable
from typing import Any

import torch

from accel_train import Accelerator

RESULTS: list[tuple[str, bool, str]] = []


def check(name: str) -> Callable[[Callable[[Accelerator], str]], Callable[[Accelerator], None]]:
    def decorator(function: Callable[[Accelerator], str]) -> Callable[[Accelerator], None]:
        def run(accelerator: Accelerator) -> None:
            try:
                detail = function(accelerator)
                RESULTS.append((name, True, detail))
            except Exception:
                RESULTS.append((name, False, traceback.format_exc(limit=4)))

        return run

    return decorator


@check("process control")
def process_control(accelerator: Accelerator) -> str:
    order = []
    with accelerator.main_process_first():
        order.append(accelerator.process_index)
    accelerator.wait_for_everyone()
    with accelerator.split_between_processes(list(range(7))) as share:
        shares = accelerator.gather_for_metrics(share, use_gather_object=True)
    assert sorted(shares) == list(range(7)), shares
    return f"barrier, main_process_first and split_between_processes over {accelerator.num_processes} process(es)"


@check("collectives")
def collectives(accelerator: Accelerator) -> str:
    n = accelerator.num_processes
    rank_tensor = torch.tensor([accelerator.process_index], device=accelerator.device)
    assert accelerator.gather(rank_tensor).tolist() == list(range(n))
    assert accelerator.reduce(rank_tensor.float(), "sum").item() == sum(range(n))
    padded = accelerator.pad_across_processes(torch.arange(accelerator.process_index + 1, device=accelerator.device))
    assert padded.shape[0] == n
    return "gather, reduce and pad_across_processes agree on every process"


@check("data loader sharding and gather_for_metrics")
def data_sharding(accelerator: Accelerator) -> str:
    length = 3 * accelerator.num_processes * 4 + 1  # uneven on purpose
    loader: Any = torch.utils.data.DataLoader(list(range(length)), batch_size=4)  # type: ignore[arg-type]
    loader = accelerator.prepare(loader)
    seen = []
    for batch in loader:
        seen.append(accelerator.gather_for_metrics(batch))
    values = torch.cat(seen).tolist()
    assert sorted(values) == list(range(length)), f"saw {len(values)} samples, expected {length}"
    return f"{length} samples each seen exactly once after gather_for_metrics"


def _regression_data(seed: int = 0) -> torch.utils.data.TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(64, 4, generator=generator)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1
    return torch.utils.data.TensorDataset(x, y)


def _baseline(steps_data: torch.utils.data.TensorDataset, batch: int, accumulation: int) -> torch.Tensor:
    torch.manual_seed(42)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = steps_data.tensors
    for start in range(0, len(x), batch * accumulation):
        optimizer.zero_grad()
        xb, yb = x[start : start + batch * accumulation], y[start : start + batch * accumulation]
        torch.nn.functional.mse_loss(model(xb), yb).backward()
        optimizer.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


@check("training matches a single-process run")
def training(accelerator: Accelerator) -> str:
    details = []
    for accumulation in (1, 2):
        accelerator.gradient_accumulation_steps = accumulation
        torch.manual_seed(42)
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        per_process = 8 // accelerator.num_processes if 8 % accelerator.num_processes == 0 else 4
        data = _regression_data()
        loader = torch.utils.data.DataLoader(data, batch_size=per_process)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        for x, y in loader:
            with accelerator.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
        got = torch.cat([p.detach().flatten().cpu() for p in accelerator.unwrap_model(model).parameters()])
        expected = _baseline(data, per_process * accelerator.num_processes, accumulation)
        tolerance = 1e-4 if accelerator.mixed_precision == "no" else 5e-2
        assert torch.allclose(got, expected, atol=tolerance), f"accumulation={accumulation}: {got} vs {expected}"
        details.append(f"accumulation {accumulation}")
        accelerator.free_memory()
    accelerator.gradient_accumulation_steps = 1
    return f"parameters equal to plain PyTorch on the global batch ({', '.join(details)}; precision {accelerator.mixed_precision})"


@check("save_state / load_state round trip")
def checkpoint(accelerator: Accelerator) -> str:
    folder = tempfile.mkdtemp() if accelerator.is_main_process else None
    folder = (
        accelerator.gather_for_metrics([folder], use_gather_object=True)[0] if accelerator.num_processes > 1 else folder
    )
    assert folder is not None
    torch.manual_seed(1)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.backward(model(torch.ones(2, 4, device=accelerator.device)).sum())
    optimizer.step()
    target = os.path.join(folder, "state")
    accelerator.save_state(target)
    before = [p.detach().clone() for p in model.parameters()]
    draw = torch.rand(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    accelerator.load_state(target)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert torch.equal(torch.rand(1), draw), "random state not restored"
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        shutil.rmtree(folder, ignore_errors=True)
    accelerator.free_memory()
    return "model, optimizer and random states restored exactly"


@check("trigger across processes")
def trigger(accelerator: Accelerator) -> str:
    if accelerator.is_last_process:
        accelerator.set_trigger()
    assert accelerator.check_trigger()
    assert not accelerator.check_trigger()
    return "set_trigger on one process seen by check_trigger on all"


@check("resume after a restart")
def resume_after_restart(accelerator: Accelerator) -> str:
    """The restart pattern of docs/faults.md: a job killed mid-epoch, between accumulation steps,
    starts again, calls ``load_state()`` and ends with the parameters of an uninterrupted run."""
    from accel_train import ProjectConfiguration

    folder = tempfile.mkdtemp() if accelerator.is_main_process else None
    folder = (
        accelerator.gather_for_metrics([folder], use_gather_object=True)[0] if accelerator.num_processes > 1 else folder
    )
    assert folder is not None
    saved_config, saved_steps = accelerator.project_configuration, accelerator.gradient_accumulation_steps
    accelerator.gradient_accumulation_steps = 2
    loaders = accelerator.dataloader_config
    saved_stateful = loaders.use_stateful_dataloader
    loaders.use_stateful_dataloader = True  # as docs/faults.md: the loop does not skip, the loader resumes
    data = torch.utils.data.TensorDataset(torch.randn(48, 4, generator=torch.Generator().manual_seed(5)))

    def run(project: str, stop_after: int | None) -> list[torch.Tensor]:
        """One 'process lifetime': prepare, resume if a checkpoint exists, train (until ``stop_after``)."""
        accelerator.free_memory()
        accelerator.project_configuration = ProjectConfiguration(
            project_dir=project, automatic_checkpoint_naming=True, continue_numbering_on_load=True
        )
        torch.manual_seed(2)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        loader = torch.utils.data.DataLoader(data, batch_size=2, shuffle=True)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        if os.path.isdir(os.path.join(project, "checkpoints")):
            accelerator.load_state()  # the latest complete checkpoint; later saves continue its numbering (opted in)
        for batches, (x,) in enumerate(loader, start=1):
            with accelerator.accumulate(model):
                accelerator.backward(model(x).pow(2).mean())
                optimizer.step()
                optimizer.zero_grad()
            if batches % 3 == 0 or batches == stop_after:
                accelerator.save_state()
            if batches == stop_after:
                return []  # "killed" here
        return [p.detach().clone() for p in model.parameters()]

    try:
        uninterrupted = run(os.path.join(folder, "uninterrupted"), None)
        restarted = os.path.join(folder, "restarted")
        run(restarted, 5)  # dies after batch 5: mid-epoch, mid-accumulation
        resumed = run(restarted, None)
        assert all(torch.equal(a, b) for a, b in zip(uninterrupted, resumed)), "resumed parameters differ"
    finally:
        accelerator.project_configuration = saved_config
        accelerator.gradient_accumulation_steps = saved_steps
        loaders.use_stateful_dataloader = saved_stateful
        accelerator.free_memory()
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            shutil.rmtree(folder, ignore_errors=True)
    return "killed mid-epoch between accumulation steps, load_state() resumed model, optimizer, RNG, loader position and accumulation phase exactly"


CHECKS = [process_control, collectives, data_sharding, training, checkpoint, resume_after_restart, trigger]


def main(end_training: bool = True) -> int:
    """Run every check; ``end_training=False`` keeps the process group (for test pools)."""
    accelerator = Accelerator()
    accelerator.print(f"accel self-test\n{accelerator.state}")
    for run in CHECKS:
        run(accelerator)
    failures = [name for name, ok, _ in RESULTS if not ok]
    all_failures = (
        accelerator.gather_for_metrics([failures], use_gather_object=True)
        if accelerator.num_processes > 1
        else [failures]
    )
    for name, ok, detail in RESULTS:
        if ok:
            accelerator.print(f"PASS  {name}: {detail}")
        else:
            print(f"FAIL  {name} (process {accelerator.process_index}):\n{detail}", file=sys.stderr)
    failed_anywhere = sorted({name for per_rank in all_failures for name in per_rank})
    accelerator.print(
        f"{len(RESULTS) - len(failures)}/{len(RESULTS)} checks passed on {accelerator.num_processes} process(es), "
        f"{accelerator.distributed_type.value}, mixed precision {accelerator.mixed_precision}"
        + (f"; failed: {', '.join(failed_anywhere)}" if failed_anywhere else "")
    )
    if end_training:
        accelerator.end_training()
    return 1 if failed_anywhere else 0


if __name__ == "__main__":
    raise SystemExit(main())
