"""Export tables of the meta-package, one module per owning distribution.

Each table module defines three dicts of plain strings (importing them costs nothing):
``TOP_LEVEL`` (name on ``accel`` -> module that defines it), ``UTILS`` (name on ``accel.utils`` ->
module) and ``MODULES`` (documented module path -> real module). Each package's issue fills its own.
"""

from __future__ import annotations

from accel._exports import bigmodel, clients, data, launch, quant, state, tracking, train

# placeholders first, then names gathered for libraries: any entry of an owning package replaces them
_TABLES = (clients, state, data, bigmodel, quant, tracking, train, launch)

TOP_LEVEL: dict[str, str] = {}
UTILS: dict[str, str] = {}
MODULES: dict[str, str] = {}
for _table in _TABLES:
    TOP_LEVEL.update(getattr(_table, "TOP_LEVEL", {}))
    UTILS.update(getattr(_table, "UTILS", {}))
    MODULES.update(getattr(_table, "MODULES", {}))
