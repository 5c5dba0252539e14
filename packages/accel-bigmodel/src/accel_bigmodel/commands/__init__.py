"""Sub-commands of ``accel`` provided by accel-bigmodel (torch-free at import)."""
