"""Load and run PyTorch models bigger than memory: device maps, offload, hooks, sharded checkpoints."""

from accel_bigmodel.__about__ import __version__

__all__ = ["__version__"]
