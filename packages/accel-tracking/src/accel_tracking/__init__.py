"""Experiment trackers for accel: TensorBoard, WandB, CometML, Aim, MLflow, ClearML, DVCLive, Trackio, SwanLab, JSON lines."""

from accel_tracking.__about__ import __version__

__all__ = ["__version__"]
