"""``tqdm`` that shows on the main process only (the module behind ``accel.utils.tqdm``)."""

from __future__ import annotations

from typing import Any


def tqdm(*args: Any, main_process_only: bool = True, **kwargs: Any) -> Any:
    """``tqdm.auto.tqdm(*args, **kwargs)``, disabled on every process but the local main one when
    ``main_process_only`` (tqdm is an optional dependency: an ImportError says how to install it).

    Args:
        *args: Positional arguments passed on unchanged.
        **kwargs: Keyword arguments passed on unchanged.
        main_process_only: Show the bar on the local main process only (disabled on the others).
    """
    from accel_state.imports import is_tqdm_available
    from accel_state.install_hints import install_hint

    if not is_tqdm_available():
        raise ImportError(f"accel.utils.tqdm needs tqdm: {install_hint('tqdm')}")
    from tqdm.auto import tqdm as auto_tqdm

    if main_process_only:
        from accel_state.state import PartialState

        kwargs["disable"] = kwargs.get("disable", False) or PartialState().local_process_index != 0
    return auto_tqdm(*args, **kwargs)
