"""The sub-commands of ``accel`` owned by accel-launch (each module: ``add_parser``, ``run``, ``main``)."""
