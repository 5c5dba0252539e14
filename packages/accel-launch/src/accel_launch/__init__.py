"""accel-launch: the ``accel`` command, config files, ``notebook_launcher`` and ``debug_launcher``.

Names load on first use (module ``__getattr__``): ``import accel_launch`` imports neither torch nor yaml.
"""

from __future__ import annotations

from accel_launch.__about__ import __version__
from accel_state.lazy import lazy_exports

_EXPORTS = {
    "notebook_launcher": "launchers",
    "debug_launcher": "launchers",
    "PrepareForLaunch": "launch_utils",
    "write_basic_config": "commands.config.default",
    "load_config_from_file": "commands.config.config_args",
    "ClusterConfig": "commands.config.config_args",
    "SageMakerConfig": "commands.config.config_args",
    "BaseConfig": "commands.config.config_args",
    "ConfigError": "values",
    "LaunchPlan": "plan",
    "resolve": "plan",
    "is_port_in_use": "runner",
}

__all__ = ["__version__", *_EXPORTS]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
