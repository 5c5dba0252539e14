"""The Accelerator: one training script for CPU, GPU, DDP, FSDP, DeepSpeed and mixed precision."""

from accel_train.__about__ import __version__

__all__ = ["__version__"]
