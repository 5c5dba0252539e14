"""Names and module paths that accel-tracking provides to the meta-package."""

_T = "accel_tracking"

TOP_LEVEL: dict[str, str] = {}

UTILS: dict[str, str] = {
    "LoggerType": f"{_T}.logger_type",
}

MODULES: dict[str, str] = {
    "accel.tracking": f"{_T}.tracking",
}
