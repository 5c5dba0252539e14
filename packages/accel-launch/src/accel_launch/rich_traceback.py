"""Importing this module (as ``accel.utils.rich``) turns on rich's tracebacks; rich is the ``rich`` extra."""

from __future__ import annotations


def _install() -> None:
    from accel_state.imports import is_rich_available
    from accel_state.install_hints import install_hint

    if not is_rich_available():
        raise ModuleNotFoundError(
            f"To use the rich extension, install the rich extra: {install_hint('accel-launch', 'rich')}"
        )
    from rich.traceback import install

    install(show_locals=False)


_install()
