"""The job restarted by tools/bench/restart.py: checkpoint every step, rank 1 dies in the first attempt.

    <launcher> tools/bench/_restart_worker.py OUT_DIR [accel|reference]

Attempt 0: rank 1 writes the time to ``OUT_DIR/death`` after step 3 and kills itself (SIGKILL).
Attempt 1: the job loads the latest checkpoint; rank 0 writes to ``OUT_DIR/first_step`` the times
it started, finished its imports, prepared, loaded the checkpoint and ran the first step, and the
job ends.
"""

from __future__ import annotations

import time

STARTED = time.time()  # before any heavy import: when the (re)started worker began

import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402


def main() -> None:
    if len(sys.argv) < 2:  # `nox -s bench` runs every script here: this one is started by restart.py
        print("_restart_worker.py is the job of tools/bench/restart.py; run that script instead")
        return
    out, framework = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "accel")
    if framework == "reference":
        from accelerate import Accelerator
        from accelerate.utils import ProjectConfiguration
    else:
        from accel_train import Accelerator, ProjectConfiguration
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    marks = {"started": STARTED, "imported": time.time()}
    project = os.path.join(out, "project")
    # The reference prunes old checkpoints on every rank (rank 1 then fails in shutil.rmtree): no limit there.
    limit = None if framework == "reference" else 1
    config = ProjectConfiguration(project_dir=project, automatic_checkpoint_naming=True, total_limit=limit)
    accelerator = Accelerator(project_config=config)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    marks["prepared"] = time.time()
    checkpoints = os.path.join(project, "checkpoints")
    if os.path.isdir(checkpoints) and os.listdir(checkpoints):
        accelerator.load_state()
    marks["loaded"] = time.time()
    inputs = torch.randn(32, 64)
    for step in range(1, 7):
        accelerator.backward(model(inputs).pow(2).mean())
        optimizer.step()
        optimizer.zero_grad()
        if attempt > 0:
            if accelerator.is_main_process:
                marks["first_step"] = time.time()
                with open(os.path.join(out, "first_step"), "w") as f:
                    f.write(repr(marks))
            break
        accelerator.save_state()
        if step == 3 and accelerator.process_index == 1:
            with open(os.path.join(out, "death"), "w") as f:
                f.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    main()
