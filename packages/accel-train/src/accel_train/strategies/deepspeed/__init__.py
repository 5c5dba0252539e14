"""The DeepSpeed backend: everything that knows about ``deepspeed`` lives here.

- `plugin`: ``DeepSpeedPlugin`` (settings, the config dict, launcher variables);
- `config`: translation of plugin fields into a DeepSpeed config, ``"auto"`` filling (pure);
- `strategy`: ``DeepSpeedStrategy`` (engine set-up, training step, checkpoint entries);
- `zero3_state`: full state dicts of a ZeRO-3 partitioned module, gathered or loaded;
- `utils`: the documented ``DummyOptim``, ``HfDeepSpeedConfig``, engine wrappers, ... (also
  ``accel_train.deepspeed_utils`` / ``accel.utils.deepspeed``).

Importing this package does no work (``deepspeed`` is imported when a run uses it).
"""

from __future__ import annotations

from accel_state.lazy import lazy_exports

_EXPORTS = {
    "DeepSpeedStrategy": "strategy",
    "EnginePrecision": "strategy",
    "_check_stand_ins": "strategy",
    "gather_zero3_state_dict": "zero3_state",
    "load_zero3_state_dict": "zero3_state",
}
__all__ = ["DeepSpeedStrategy", "EnginePrecision", "gather_zero3_state_dict", "load_zero3_state_dict"]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
