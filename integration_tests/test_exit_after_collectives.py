"""A 2-process script that ends right after a collective exits cleanly, every time (issue 37).

A gloo worker thread that frees a finished work after the interpreter began to shut down aborts the
process (``terminate called without an active exception``, SIGABRT) and the launcher reports a finished
run as failed; it struck the quick-tour evaluation example about once in fifty runs on a loaded machine.
accel's collectives keep their last works referenced (``accel_state.kept_works``). The script below is
that example: it ends on ``gather_for_metrics``. The case runs it many times, so it runs before a
release (``nox -s slow``); accel-state's distributed tests check in every CI run that the works are kept.
"""

from __future__ import annotations

import pathlib

import pytest
from conftest import accel_command, run_command

SCRIPT = """
import torch
from accel import Accelerator

accelerator = Accelerator()
model = torch.nn.Linear(4, 3)
data = torch.utils.data.TensorDataset(torch.randn(101, 4), torch.randint(0, 3, (101,)))
model, loader = accelerator.prepare(model, torch.utils.data.DataLoader(data, batch_size=8))
model.eval()
seen = 0
with torch.no_grad():
    for x, labels in loader:
        predictions, labels = accelerator.gather_for_metrics((model(x).argmax(dim=-1), labels))
        seen += len(labels)
assert seen == 101, seen
accelerator.print("seen", seen)
"""

RUNS = 60


@pytest.mark.release(
    covered_by="accel-state's test_collectives_keep_their_last_works_and_the_object_collectives_match_torch"
)
@pytest.mark.timeout(RUNS * 60)
def test_a_script_ending_on_a_gather_exits_cleanly_every_time(tmp_path: pathlib.Path) -> None:
    script = tmp_path / "evaluate.py"
    script.write_text(SCRIPT)
    failures = []
    for run in range(RUNS):
        done = run_command([*accel_command(), "launch", "--cpu", "--num_processes", "2", str(script)], timeout=120)
        if done.returncode != 0 or "seen 101" not in done.stdout:
            failures.append(f"run {run}: exit {done.returncode}\n{(done.stdout + done.stderr)[-1500:]}")
    assert not failures, f"{len(failures)} of {RUNS} runs failed:\n" + "\n".join(failures[:3])
