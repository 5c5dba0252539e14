"""Sharded, resumable, device-placing data loaders for distributed PyTorch."""

from accel_data.__about__ import __version__

__all__ = ["__version__"]
