"""An accel training function run unchanged by Ray Train's ``TorchTrainer`` or by ``accel launch``.

Ray starts the workers and their process group (gloo on CPU); ``Accelerator()`` finds that group and
uses it (no second initialisation), so ``prepare`` shards the data by Ray's ranks. A checkpoint is
``save_state`` to a folder, reported to Ray with ``ray.train.report(..., checkpoint=...)``; after a
worker dies, ``FailureConfig(max_failures=...)`` restarts the group and ``train_func`` resumes from
``ray.train.get_checkpoint()`` with ``load_state``.

    python examples/ray_train.py --workers 2 --out /tmp/ray_run          # Ray Train, 2 CPU workers
    accel launch --cpu --num_processes 2 examples/ray_train.py --plain --out /tmp/plain_run

Every connection stays on this machine: :func:`loopback_only` sets Ray's usage statistics off, the
node address to 127.0.0.1, no dashboard, and HTTP(S) proxies to a closed loopback port.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from typing import Any

EPOCHS = 4
#: Epoch, batch and worker rank at which ``--kill_at`` makes a worker SIGKILL itself (first attempt only).
KILL_FORMAT = "epoch:batch:rank"


class Progress:
    """The epoch to start from, saved with the state (``register_for_checkpointing``)."""

    def __init__(self) -> None:
        self.epoch = 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch = int(state["epoch"])


def train_func(config: dict[str, Any]) -> None:
    """The training loop: the same code under Ray Train and under ``accel launch``.

    Args:
        config: ``out`` (a folder for the checkpoints and the final weights, seen by every worker),
            ``ray`` (report checkpoints to Ray), ``kill_at`` (``epoch:batch:rank`` to SIGKILL a worker
            once, to show a restart), ``steps_log`` (append ``epoch time`` after every step on rank 0).
    """
    import torch
    from safetensors.torch import save_file

    from accel_train import Accelerator

    out = config["out"]
    accelerator = Accelerator()
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(256, 16), torch.randn(256, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=False)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    progress = Progress()
    accelerator.register_for_checkpointing(progress)

    if config.get("ray"):
        import ray.train

        checkpoint = ray.train.get_checkpoint()
        if checkpoint is not None:
            with checkpoint.as_directory() as folder:
                accelerator.load_state(folder)
            accelerator.print(f"resumed from epoch {progress.epoch}")
    rank = accelerator.process_index
    kill = [int(x) for x in config["kill_at"].split(":")] if config.get("kill_at") else None
    marker = os.path.join(out, "killed_once")

    start_epoch = progress.epoch
    for epoch in range(start_epoch, EPOCHS):
        for batch, (inputs, targets) in enumerate(loader):
            if kill == [epoch, batch, rank] and not os.path.exists(marker):
                open(marker, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)
            loss = torch.nn.functional.mse_loss(model(inputs), targets)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            if config.get("steps_log") and rank == 0:
                with open(config["steps_log"], "a") as log:
                    log.write(f"{epoch} {time.time():.6f}\n")
        scheduler.step()
        progress.epoch = epoch + 1
        if config.get("ray"):
            report_checkpoint(accelerator, os.path.join(out, f"epoch_{epoch + 1}"), {"loss": loss.item()})
    weights = {k: v.detach().clone().contiguous() for k, v in accelerator.unwrap_model(model).state_dict().items()}
    final = os.path.join(out, "final.safetensors")
    if accelerator.is_main_process:
        save_file(weights, final)
    done = (
        f"epochs {start_epoch + 1}-{EPOCHS}, last loss {loss.item():.4f}" if start_epoch < EPOCHS else "no epoch left"
    )
    accelerator.print(f"trained {done} on {accelerator.num_processes} process(es); final weights in {final}")
    accelerator.end_training()


def report_checkpoint(accelerator: Any, folder: str, metrics: dict[str, Any]) -> None:
    """``save_state(folder)`` on every worker, then one Ray checkpoint of that folder (from rank 0;
    the others report the metrics only). ``folder`` must be one every worker writes to (this machine,
    or a shared file system), as for any ``save_state`` of several processes."""
    import ray.train

    accelerator.save_state(folder)
    checkpoint = ray.train.Checkpoint.from_directory(folder) if accelerator.is_main_process else None
    ray.train.report(metrics, checkpoint=checkpoint)


#: Variables that keep Ray on this machine (set before ``ray.init``; the workers inherit them).
LOOPBACK_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    # Ray turns a 127.0.0.1 node address into the machine's outward address unless it runs as a
    # one-machine instance; this variable (despite its name, read on Linux too) makes it one.
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "HTTP_PROXY": "http://127.0.0.1:9",
    "HTTPS_PROXY": "http://127.0.0.1:9",
    "http_proxy": "http://127.0.0.1:9",
    "https_proxy": "http://127.0.0.1:9",
    "NO_PROXY": "localhost,127.0.0.1",
    "no_proxy": "localhost,127.0.0.1",
}


def loopback_only(num_cpus: int) -> None:
    """Start a local Ray on 127.0.0.1 only: no usage statistics, no dashboard, proxies to a closed port."""
    os.environ.update(LOOPBACK_ENV)
    import ray

    ray.init(
        _node_ip_address="127.0.0.1",
        include_dashboard=False,
        num_cpus=num_cpus,
        log_to_driver=True,
        runtime_env={"env_vars": {**LOOPBACK_ENV, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}},
    )


def run_with_ray(config: dict[str, Any], workers: int, max_failures: int) -> Any:
    """``train_func`` under ``TorchTrainer`` on ``workers`` CPU workers; the Ray result."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    trainer = TorchTrainer(
        train_func,
        train_loop_config={**config, "ray": True},
        scaling_config=ScalingConfig(num_workers=workers, use_gpu=False, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(
            name="accel_ray_example",
            storage_path=os.path.join(config["out"], "ray_storage"),
            failure_config=FailureConfig(max_failures=max_failures),
        ),
    )
    return trainer.fit()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="Folder for checkpoints and the final weights.")
    parser.add_argument("--plain", action="store_true", help="Run train_func here (under accel launch), not in Ray.")
    parser.add_argument("--workers", type=int, default=2, help="Ray Train workers (CPU).")
    parser.add_argument("--max_failures", type=int, default=1, help="Worker-group restarts Ray may do.")
    parser.add_argument("--kill_at", default=None, help=f"{KILL_FORMAT}: SIGKILL that worker once (a demo fault).")
    parser.add_argument(
        "--steps_log", default=None, help="Append `epoch time` after every step on rank 0 to this file."
    )
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    config = {"out": os.path.abspath(args.out), "kill_at": args.kill_at, "steps_log": args.steps_log}
    if args.plain:
        train_func(config)
        return
    loopback_only(num_cpus=args.workers + 1)
    result = run_with_ray(config, args.workers, args.max_failures)
    if result.error is not None:
        raise SystemExit(f"the Ray run failed: {result.error}")
    print(f"Ray run done; last checkpoint: {result.checkpoint}")


if __name__ == "__main__":
    main()
