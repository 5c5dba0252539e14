"""The Accelerator's read-only view of the run: devices, processes, precision, data-loader settings.

A public component of the :class:`~accel_train.accelerator.Accelerator` facade: the documented attributes
are defined (and documented) here.
"""

from __future__ import annotations

from typing import Any

import torch

from accel_state.enums import DistributedType
from accel_train.strategies import DDP_TYPES

__all__ = ["AcceleratorAttributes"]


class AcceleratorAttributes:
    """Documented attributes, read from the shared state and the Accelerator's configuration."""

    state: Any
    precision: Any
    _strategy: Any
    gradient_state: Any
    dataloader_config: Any
    project_configuration: Any
    _optimizers: list[Any]

    # -- attributes -------------------------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        return self.state.device

    @property
    def distributed_type(self) -> DistributedType:
        return self.state.distributed_type

    @property
    def num_processes(self) -> int:
        return self.state.num_processes

    @property
    def process_index(self) -> int:
        return self.state.process_index

    @property
    def local_process_index(self) -> int:
        return self.state.local_process_index

    @property
    def is_main_process(self) -> bool:
        return self.state.is_main_process

    @property
    def is_local_main_process(self) -> bool:
        return self.state.is_local_main_process

    @property
    def is_last_process(self) -> bool:
        return self.state.is_last_process

    @property
    def use_distributed(self) -> bool:
        return self.state.use_distributed

    @property
    def multi_device(self) -> bool:
        return self.use_distributed and self.distributed_type in DDP_TYPES

    @property
    def mixed_precision(self) -> str:
        return self.state.mixed_precision

    @property
    def sync_gradients(self) -> bool:
        return self.gradient_state.sync_gradients

    @sync_gradients.setter
    def sync_gradients(self, value: bool) -> None:
        self.gradient_state._set_sync_gradients(value)

    @property
    def gradient_accumulation_steps(self) -> int:
        return self.gradient_state.num_steps

    @gradient_accumulation_steps.setter
    def gradient_accumulation_steps(self, value: int) -> None:
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"gradient_accumulation_steps must be an int >= 1, got {value!r}")
        self.gradient_state.plugin_kwargs = {**self.gradient_state.plugin_kwargs, "num_steps": value}

    @property
    def optimizer_step_was_skipped(self) -> bool:
        """True when an fp16 optimizer step was skipped because of inf/NaN gradients."""
        return any(optimizer.step_was_skipped for optimizer in self._optimizers)

    @property
    def project_dir(self) -> str | None:
        return self.project_configuration.project_dir

    @property
    def logging_dir(self) -> str | None:
        return self.project_configuration.logging_dir

    @property
    def save_iteration(self) -> int:
        return self.project_configuration.iteration

    @property
    def split_batches(self) -> bool:
        return bool(self.dataloader_config.split_batches)

    @property
    def dispatch_batches(self) -> bool | None:
        return self.dataloader_config.dispatch_batches

    @property
    def even_batches(self) -> bool:
        return bool(self.dataloader_config.even_batches)

    @even_batches.setter
    def even_batches(self, value: bool) -> None:
        self.dataloader_config.even_batches = value

    @property
    def use_seedable_sampler(self) -> bool:
        return bool(self.dataloader_config.use_seedable_sampler)

    @property
    def non_blocking(self) -> bool:
        return bool(self.dataloader_config.non_blocking)

    @property
    def use_stateful_dataloader(self) -> bool:
        return bool(getattr(self.dataloader_config, "use_stateful_dataloader", False))

    @property
    def deepspeed_plugin(self) -> Any:
        return self.state.deepspeed_plugin

    @property
    def fsdp_plugin(self) -> Any:
        return self.state.fsdp_plugin

    @property
    def megatron_lm_plugin(self) -> Any:
        return self.state.megatron_lm_plugin

    @property
    def is_fsdp2(self) -> bool:
        return self.state.is_fsdp2

    @property
    def parallelism_config(self) -> Any:
        return self.state.parallelism_config

    @property
    def fp8_backend(self) -> str | None:
        """The FP8 backend of the precision (``TE``, ``MSAMP``, ``AO``), ``None`` without FP8."""
        return self.precision.fp8_backend

    @property
    def torch_device_mesh(self) -> Any:
        """The strategy's ``DeviceMesh``; with a ``ParallelismConfig`` whose strategy needs none (plain
        data parallelism over several processes), the config's mesh, so its documented names
        (``dp``, ``dp_cp``, ...) index it; ``None`` otherwise."""
        mesh = self._strategy.device_mesh
        config = self.state.parallelism_config
        if mesh is None and config is not None and self.state.num_processes > 1:
            mesh = config.get_device_mesh(self.state.device.type)
        return mesh

    @property
    def should_save_model(self) -> bool:
        return True

    @property
    def is_composable_parallelism_enabled(self) -> bool:
        return bool(self._strategy.is_composable_parallelism_enabled)

    @property
    def data_parallel_rank(self) -> int:
        """Rank along the replicated data-parallel dimension (``dp_replicate``), as documented; 0 without it."""
        return self._strategy.parallel_dims.dp_replicate_rank

    @property
    def data_parallel_shard_rank(self) -> int:
        return self._strategy.parallel_dims.dp_shard_rank

    @property
    def tensor_parallel_rank(self) -> int:
        return self._strategy.parallel_dims.tp_rank

    @property
    def context_parallel_rank(self) -> int:
        return self._strategy.parallel_dims.cp_rank

    @property
    def pipeline_parallel_rank(self) -> int:
        return 0
