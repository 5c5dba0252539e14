"""accel-launch: the ``accel`` command, config files, ``notebook_launcher`` and ``debug_launcher``.

Names load on first use (module ``__getattr__``): ``import accel_launch`` imports neither torch nor yaml.
"""

from __future__ import annotations

import importlib

from accel_launch.__about__ import __version__

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time: `accel --help` stays fast
    from typing import Any

_EXPORTS = {
    "notebook_launcher": "accel_launch.launchers",
    "debug_launcher": "accel_launch.launchers",
    "PrepareForLaunch": "accel_launch.launch_utils",
    "write_basic_config": "accel_launch.commands.config.default",
    "load_config_from_file": "accel_launch.commands.config.config_args",
    "ClusterConfig": "accel_launch.commands.config.config_args",
    "SageMakerConfig": "accel_launch.commands.config.config_args",
    "BaseConfig": "accel_launch.commands.config.config_args",
    "ConfigError": "accel_launch.values",
    "LaunchPlan": "accel_launch.plan",
    "resolve": "accel_launch.plan",
    "is_port_in_use": "accel_launch.runner",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'accel_launch' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
