"""Names and module paths that accel-train provides to the meta-package (filled when it is implemented)."""

TOP_LEVEL: dict[str, str] = {}
UTILS: dict[str, str] = {}
MODULES: dict[str, str] = {}
