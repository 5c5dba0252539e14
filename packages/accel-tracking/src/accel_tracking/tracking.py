"""The documented ``accel.tracking`` module: the tracker contract, every built-in tracker and the registry.

Importing it imports no tracking library: each tracker imports its own when its run starts.
"""

from __future__ import annotations

from accel_tracking.dispatch import TrackerError, finish_all, log_to_all, start_all, store_config_to_all
from accel_tracking.general import GeneralTracker, on_main_process
from accel_tracking.logger_type import LoggerType
from accel_tracking.registry import (
    LOGGER_TYPE_TO_CLASS,
    NotATrackerClassError,
    filter_trackers,
    get_available_trackers,
    register_tracker_class,
)
from accel_tracking.trackers.aim import AimTracker
from accel_tracking.trackers.clearml import ClearMLTracker
from accel_tracking.trackers.comet_ml import CometMLTracker
from accel_tracking.trackers.dvclive import DVCLiveTracker
from accel_tracking.trackers.jsonl import JSONLTracker, read_jsonl
from accel_tracking.trackers.mlflow import MLflowTracker
from accel_tracking.trackers.swanlab import SwanLabTracker
from accel_tracking.trackers.tensorboard import TensorBoardTracker
from accel_tracking.trackers.trackio import TrackioTracker
from accel_tracking.trackers.wandb import WandBTracker

__all__ = [
    "LOGGER_TYPE_TO_CLASS",
    "AimTracker",
    "ClearMLTracker",
    "CometMLTracker",
    "DVCLiveTracker",
    "GeneralTracker",
    "JSONLTracker",
    "LoggerType",
    "MLflowTracker",
    "NotATrackerClassError",
    "SwanLabTracker",
    "TensorBoardTracker",
    "TrackerError",
    "TrackioTracker",
    "WandBTracker",
    "filter_trackers",
    "finish_all",
    "get_available_trackers",
    "log_to_all",
    "on_main_process",
    "read_jsonl",
    "register_tracker_class",
    "start_all",
    "store_config_to_all",
]
