"""Sub-commands of ``accel`` owned by accel-train: ``test`` and ``merge-weights``."""
