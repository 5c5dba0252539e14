"""Reading plugin fields from the environment that ``accel launch`` writes.

A plugin field left ``None`` in code takes the value of its variable (declared once in
`accel_state.env_vars`) when the launcher set it, else the documented default. So
``accel launch --config_file fsdp.yaml script.py`` and ``FullyShardedDataParallelPlugin()`` in the
script agree without the script repeating the file.
"""

from __future__ import annotations

import os
from typing import Any

from accel_state import env_vars

__all__ = ["env_value", "fill_from_env"]


def env_value(name: str, default: Any = None) -> Any:
    """The typed value of variable ``name`` when it is set (and not empty), else ``default``."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    return env_vars.spec(name).parse(raw)


def fill_from_env(obj: Any, table: dict[str, tuple[str, Any]]) -> None:
    """For each ``field: (variable, default)`` of ``table``, set ``obj.field`` when it is ``None``."""
    for field, (name, default) in table.items():
        if getattr(obj, field) is None:
            setattr(obj, field, env_value(name, default))
