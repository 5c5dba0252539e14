"""The accel command: config files, accel launch, notebook and debug launchers."""

from accel_launch.__about__ import __version__

__all__ = ["__version__"]
