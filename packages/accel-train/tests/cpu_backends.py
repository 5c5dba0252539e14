"""The backends that train for real on CPU, as one table for the tests that must hold for every backend.

Each entry builds an Accelerator for the backend (inside a rank of a 2-process
`accel_state.testing.DistributedPool`), a small model the backend can take, one training step and the
state a checkpoint must bring back. A test parametrized over `CPU_BACKENDS` runs its case on every
backend; a backend added here gets every such test.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from fsdp_helpers import BlockNet

from accel_state.imports import is_deepspeed_available
from accel_state.install_hints import install_hint


class PlannedBlockNet(BlockNet):
    """The block model with a tensor-parallel plan (for ``tp_size`` > 1)."""

    tp_plan = {"blocks.*.up": "colwise", "blocks.*.down": "rowwise"}


class StackedExperts(torch.nn.Module):
    """Four experts with stacked weights, of the expert-module contract (``accel_bigmodel.experts``)."""

    def __init__(self, num_experts: int = 4, width: int = 8, hidden: int = 16) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.up = torch.nn.Parameter(torch.randn(num_experts, hidden, width) * 0.3)
        self.down = torch.nn.Parameter(torch.randn(num_experts, width, hidden) * 0.3)

    def forward(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        out = torch.zeros_like(hidden_states)
        for expert in range(self.num_experts):
            token, choice = torch.where(top_k_index == expert)
            hidden = torch.relu(hidden_states[token] @ self.up[expert].T) @ self.down[expert].T
            out.index_add_(0, token, hidden * top_k_weights[token, choice, None])
        return out


class ExpertBlockNet(torch.nn.Module):
    """A projection, a mixture-of-experts block (router, top-2 of 4 stacked experts) and a head."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(4, width)
        self.router = torch.nn.Linear(width, 4, bias=False)
        self.experts = StackedExperts(4, width)
        self.head = torch.nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        weights, index = torch.topk(torch.softmax(self.router(x), dim=-1), 2, dim=-1)
        return self.head(x + self.experts(x, index, weights))


def _mse(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(out, target)


@dataclass(frozen=True)
class CpuBackend:
    """One backend as the tests drive it.

    Args:
        name: the test id.
        strategy: the registered strategy the Accelerator runs (`accel_train.strategies.STRATEGIES`).
        kwargs: what the Accelerator is given (built lazily: the plugins import torch.distributed parts).
        pipeline: whether the model is a pipeline (forward takes the target and returns the loss).
        requires: why the backend cannot run here, or ``None`` when it can.
        experts: whether the model is a mixture of experts (`ExpertBlockNet`), for expert parallelism.
    """

    name: str
    strategy: str
    kwargs: Callable[[str], dict[str, Any]]
    pipeline: bool = False
    requires: Callable[[], str | None] = lambda: None
    experts: bool = False

    def accelerator(self, base: str) -> Any:
        from accel_train import Accelerator

        return Accelerator(**self.kwargs(base))

    def model(self) -> torch.nn.Module:
        torch.manual_seed(0)
        if self.pipeline:
            return torch.nn.Sequential(
                torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)
            )
        return ExpertBlockNet() if self.experts else PlannedBlockNet()

    def prepare(self, accelerator: Any) -> tuple[Any, Any]:
        """The prepared model and AdamW (a data loader is prepared beside them, as DeepSpeed takes its
        batch size from it; the tests feed batches of 4 themselves, the same on every process)."""
        model = self.model()
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
        if self.pipeline:
            return tuple(accelerator.prepare(model, optimizer))  # type: ignore[return-value]
        data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
        model, optimizer, _ = accelerator.prepare(model, optimizer, torch.utils.data.DataLoader(data, batch_size=4))
        return model, optimizer

    def step(self, accelerator: Any, model: Any, optimizer: Any, index: int) -> None:
        """One optimizer step on batch ``index`` (the same batch on every process)."""
        generator = torch.Generator().manual_seed(100 + index)
        x = torch.randn(4, 4, generator=generator)
        accelerator.backward(self.loss(model, x, x.sum(dim=1, keepdim=True).sin()))
        optimizer.step()
        optimizer.zero_grad()

    def loss(self, model: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return model(x, target=y) if self.pipeline else _mse(model(x), y)

    def state(self, accelerator: Any, model: Any) -> dict[str, torch.Tensor]:
        """What a checkpoint must bring back, comparable between two moments of the same run."""
        if self.pipeline:  # each stage's own parameters
            return {name: p.detach().clone() for name, p in model.named_parameters()}
        return {k: v.detach().float().clone() for k, v in accelerator.get_state_dict(model).items()}


def _deepspeed_missing() -> str | None:
    return None if is_deepspeed_available() else f"needs DeepSpeed: {install_hint('accel-train', 'deepspeed')}"


def _fsdp(version: int) -> Callable[[str], dict[str, Any]]:
    def kwargs(base: str) -> dict[str, Any]:
        from accel_train import FullyShardedDataParallelPlugin

        plugin = FullyShardedDataParallelPlugin(
            fsdp_version=version, state_dict_type="SHARDED_STATE_DICT", auto_wrap_policy="TRANSFORMER_BASED_WRAP"
        )
        return {"fsdp_plugin": plugin}

    return kwargs


def _zero(stage: int) -> Callable[[str], dict[str, Any]]:
    def kwargs(base: str) -> dict[str, Any]:
        from accel_train import DeepSpeedPlugin

        return {"deepspeed_plugin": DeepSpeedPlugin(zero_stage=stage, zero3_save_16bit_model=stage == 3)}

    return kwargs


def _automatic(base: str) -> dict[str, Any]:
    from accel_train import ProjectConfiguration

    return {"project_config": ProjectConfiguration(project_dir=base, automatic_checkpoint_naming=True)}


def _parallelism(**sizes: Any) -> Callable[[str], dict[str, Any]]:
    def kwargs(base: str) -> dict[str, Any]:
        from accel_train import PipelineParallelConfig
        from accel_train.parallelism_config import ParallelismConfig

        given = dict(sizes)
        world = int(os.environ.get("WORLD_SIZE", "1"))  # the pool's size (its group starts with the Accelerator)
        product = 1
        for size in given.values():
            product *= size
        if world > product and world % product == 0:  # more processes: the extra factor shards data
            given["dp_shard_size"] = given.get("dp_shard_size", 1) * (world // product)
        if given.get("pp_size", 1) > 1:
            given["pp_handler"] = PipelineParallelConfig(num_microbatches=2, loss_fn=_mse)
        return {"parallelism_config": ParallelismConfig(**given)}

    return kwargs


#: Every backend that trains on 2 CPU processes. ``ddp`` saves into an explicit folder, where the main
#: process writes alone (as documented); ``ddp_automatic`` keeps every process in step (automatic naming).
CPU_BACKENDS: list[CpuBackend] = [
    CpuBackend("ddp", "ddp", lambda base: {}),
    CpuBackend("ddp_automatic", "ddp", _automatic),
    CpuBackend("fsdp1", "fsdp", _fsdp(1)),
    CpuBackend("fsdp2", "fsdp", _fsdp(2)),
    CpuBackend("zero1", "deepspeed", _zero(1), requires=_deepspeed_missing),
    CpuBackend("zero2", "deepspeed", _zero(2), requires=_deepspeed_missing),
    CpuBackend("zero3", "deepspeed", _zero(3), requires=_deepspeed_missing),
    CpuBackend("tp", "nd_parallel", _parallelism(tp_size=2)),
    CpuBackend("pipeline", "pipeline", _parallelism(pp_size=2), pipeline=True),
    CpuBackend("ep", "nd_parallel", _parallelism(ep_size=2), experts=True),
]
BACKENDS_BY_NAME = {backend.name: backend for backend in CPU_BACKENDS}

#: Registered strategies that have no entry above, and where their contract cases run instead. A strategy
#: registered later with neither fails `test_contract_coverage.py`: it gets the suite by joining the table.
NOT_IN_THE_TABLE: dict[str, str] = {
    "single_device": "one process: the same cases run in-process (test_checkpoint_trust.py, test_checkpoint_kill.py, test_train_checkpoint.py)",
    "megatron_lm": "megatron-core's parallel layers need CUDA past set-up (test_checkpoint_megatron_io.py checks its files)",
    "xla": "one replica on torch_xla's CPU device, not a 2-process gloo pool: its contract cases (exact resume, "
    "a planted pickle refused with nothing changed, RNG and loader position back) are test_xla_device.py, "
    "run by `nox -s xla` (torch_xla has no build for this torch)",
}
