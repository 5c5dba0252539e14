"""bitsandbytes quantization and FP8 model conversion for accel."""

from accel_quant.__about__ import __version__

__all__ = ["__version__"]
