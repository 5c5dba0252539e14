"""``accel.commands``: the documented command modules, aliases of those in the owning packages.

Each runs with ``python -m accel.commands.<name>``.
"""
