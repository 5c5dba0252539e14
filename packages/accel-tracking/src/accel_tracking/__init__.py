"""accel-tracking: experiment trackers (TensorBoard, WandB, CometML, Aim, MLflow, ClearML, DVCLive, Trackio,
SwanLab and a dependency-free JSON-lines tracker), run on the main process only.

Names load on first use (module ``__getattr__``): ``import accel_tracking`` imports no tracking library
and not torch.
"""

from __future__ import annotations

from accel_state.lazy import lazy_exports
from accel_tracking.__about__ import __version__

_NAMES = [
    "LOGGER_TYPE_TO_CLASS",
    "AimTracker",
    "ClearMLTracker",
    "CometMLTracker",
    "DVCLiveTracker",
    "GeneralTracker",
    "JSONLTracker",
    "LoggerType",
    "MLflowTracker",
    "SwanLabTracker",
    "TensorBoardTracker",
    "NotATrackerClassError",
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

__all__ = ["__version__", *_NAMES]
_EXPORTS = dict.fromkeys(_NAMES, "tracking")


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
