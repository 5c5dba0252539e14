"""Importing this module (as ``accel.utils.rich``) turns on rich's tracebacks; rich is the ``rich`` extra."""

from __future__ import annotations


def _install() -> None:
    from accel_state.imports import is_rich_available

    if not is_rich_available():
        raise ModuleNotFoundError('To use the rich extension, install rich: pip install "accel-launch[rich]"')
    from rich.traceback import install

    install(show_locals=False)


_install()
