"""The Accelerator's read-only view of the run: devices, processes, precision, data-loader settings.

A public component of the `Accelerator` facade: the documented attributes
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
        """The device of this process (the one prepared objects are moved to)."""
        return self.state.device

    @property
    def distributed_type(self) -> DistributedType:
        """The kind of distributed setup of the run (``NO``, ``MULTI_GPU``, ``DEEPSPEED``, ``FSDP``, ...)."""
        return self.state.distributed_type

    @property
    def num_processes(self) -> int:
        """The total number of processes of the run."""
        return self.state.num_processes

    @property
    def process_index(self) -> int:
        """The global index of this process."""
        return self.state.process_index

    @property
    def local_process_index(self) -> int:
        """The index of this process on its machine."""
        return self.state.local_process_index

    @property
    def is_main_process(self) -> bool:
        """True on the main process (global index 0)."""
        return self.state.is_main_process

    @property
    def is_local_main_process(self) -> bool:
        """True on the main process of each machine (local index 0)."""
        return self.state.is_local_main_process

    @property
    def is_last_process(self) -> bool:
        """True on the last process (global index ``num_processes - 1``)."""
        return self.state.is_last_process

    @property
    def use_distributed(self) -> bool:
        """True when the run uses more than one process."""
        return self.state.use_distributed

    @property
    def multi_device(self) -> bool:
        """True when the run is distributed over several devices with data parallelism."""
        return self.use_distributed and self.distributed_type in DDP_TYPES

    @property
    def mixed_precision(self) -> str:
        """The mixed-precision mode of the run (``no``, ``fp16``, ``bf16`` or ``fp8``)."""
        return self.state.mixed_precision

    @property
    def sync_gradients(self) -> bool:
        """True when gradients are synchronized and the optimizer steps (the last accumulation step)."""
        return self.gradient_state.sync_gradients

    @sync_gradients.setter
    def sync_gradients(self, value: bool) -> None:
        self.gradient_state._set_sync_gradients(value)

    @property
    def gradient_accumulation_steps(self) -> int:
        """The number of steps gradients are accumulated over before the optimizer steps."""
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
        """The project's directory, where checkpoints and logs are written (``None`` if unset)."""
        return self.project_configuration.project_dir

    @property
    def logging_dir(self) -> str | None:
        """The directory trackers log to (``None`` if unset)."""
        return self.project_configuration.logging_dir

    @property
    def save_iteration(self) -> int:
        """The number of the next automatically named checkpoint (``checkpoint_<n>``)."""
        return self.project_configuration.iteration

    @property
    def split_batches(self) -> bool:
        """True when each batch of the data loaders is split across processes."""
        return bool(self.dataloader_config.split_batches)

    @property
    def dispatch_batches(self) -> bool | None:
        """True when the main process reads the batches and sends each process its share; ``None`` for the default."""
        return self.dataloader_config.dispatch_batches

    @property
    def even_batches(self) -> bool:
        """True when the last batches are completed with samples from the start so every process gets one."""
        return bool(self.dataloader_config.even_batches)

    @even_batches.setter
    def even_batches(self, value: bool) -> None:
        self.dataloader_config.even_batches = value

    @property
    def use_seedable_sampler(self) -> bool:
        """True when data loaders use a ``SeedableRandomSampler`` for reproducible shuffling."""
        return bool(self.dataloader_config.use_seedable_sampler)

    @property
    def non_blocking(self) -> bool:
        """True when batches are moved to the device with non-blocking copies."""
        return bool(self.dataloader_config.non_blocking)

    @property
    def use_stateful_dataloader(self) -> bool:
        """True when prepared data loaders are stateful (their position can be saved and restored)."""
        return bool(getattr(self.dataloader_config, "use_stateful_dataloader", False))

    @property
    def deepspeed_plugin(self) -> Any:
        """The active ``DeepSpeedPlugin``, or ``None`` without DeepSpeed."""
        return self.state.deepspeed_plugin

    @property
    def fsdp_plugin(self) -> Any:
        """The ``FullyShardedDataParallelPlugin``, or ``None`` without FSDP."""
        return self.state.fsdp_plugin

    @property
    def megatron_lm_plugin(self) -> Any:
        """The ``MegatronLMPlugin``, or ``None`` without Megatron-LM."""
        return self.state.megatron_lm_plugin

    @property
    def is_fsdp2(self) -> bool:
        """True when the run uses FSDP version 2."""
        return self.state.is_fsdp2

    @property
    def parallelism_config(self) -> Any:
        """The ``ParallelismConfig`` of the run, or ``None``."""
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
        """True when this process should save the model (always, in this implementation)."""
        return True

    @property
    def is_composable_parallelism_enabled(self) -> bool:
        """True when several parallelism dimensions (e.g. FSDP with tensor parallelism) are combined."""
        return bool(self._strategy.is_composable_parallelism_enabled)

    @property
    def data_parallel_rank(self) -> int:
        """Rank along the replicated data-parallel dimension (``dp_replicate``), as documented; 0 without it."""
        return self._strategy.parallel_dims.dp_replicate_rank

    @property
    def data_parallel_shard_rank(self) -> int:
        """Rank along the sharded data-parallel dimension (``dp_shard``); 0 without it."""
        return self._strategy.parallel_dims.dp_shard_rank

    @property
    def tensor_parallel_rank(self) -> int:
        """Rank along the tensor-parallel dimension (``tp``); 0 without it."""
        return self._strategy.parallel_dims.tp_rank

    @property
    def context_parallel_rank(self) -> int:
        """Rank along the context-parallel dimension (``cp``); 0 without it."""
        return self._strategy.parallel_dims.cp_rank

    @property
    def expert_parallel_rank(self) -> int:
        """Rank along the expert-parallel dimension (``ep``); 0 without it."""
        return self._strategy.parallel_dims.ep_rank

    @property
    def expert_token_counts(self) -> dict[str, Any]:
        """Load balance of a mixture-of-experts model under expert parallelism: for each expert module (by
        qualified name), how many of this process's (token, choice) pairs each expert received in the
        module's latest forward, an int64 tensor ``[num_experts]``. Sum it over processes with
        ``accelerator.reduce(counts, "sum")``; feed it to an auxiliary loss or a log. Empty without
        expert parallelism."""
        return self._strategy.expert_token_counts

    @property
    def pipeline_parallel_rank(self) -> int:
        """Rank along the pipeline-parallel dimension; always 0, as pipeline parallelism is not composed here."""
        return 0
