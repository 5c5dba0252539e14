"""The named public components the `Accelerator` facade is made of.

- `attributes`: `AcceleratorAttributes`, the documented read-only attributes;
- `process_ops`: `ProcessOperations`, process control and collectives;
- `checkpointer`: `Checkpointer`, ``save_state`` / ``load_state`` / ``save_model`` and the
  registration of objects and hooks (`RemovableHandle`);
- `trackers`: `Trackers`, experiment tracking.

Each defines and documents its methods; the Accelerator combines them and holds no backend branch.
Importing this package does no work.
"""

from __future__ import annotations

from accel_state.lazy import lazy_exports

_EXPORTS = {
    "AcceleratorAttributes": "attributes",
    "ProcessOperations": "process_ops",
    "Checkpointer": "checkpointer",
    "RemovableHandle": "checkpointer",
    "Trackers": "trackers",
}
__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
