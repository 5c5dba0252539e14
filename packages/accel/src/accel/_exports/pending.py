"""Placeholders (see ``accel._pending``) for DeepSpeed names that have not landed yet (the FSDP ones have).

Registered before every other table, so a real entry of the owning package replaces each one.
"""

_P = "accel._pending"

TOP_LEVEL: dict[str, str] = {}
UTILS: dict[str, str] = {
    name: _P
    for name in (
        "HfDeepSpeedConfig",
        "DummyOptim",
        "DummyScheduler",
        "DeepSpeedEngineWrapper",
        "DeepSpeedOptimizerWrapper",
        "DeepSpeedSchedulerWrapper",
        "get_active_deepspeed_plugin",
        "map_pytorch_optim_to_deepspeed",
    )
}
MODULES: dict[str, str] = {
    "accel.utils.deepspeed": _P,
}
