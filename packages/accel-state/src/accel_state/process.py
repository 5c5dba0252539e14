"""Module-level process control: the same helpers as the methods of ``PartialState``."""

from __future__ import annotations

from typing import Any

from accel_state.state import PartialState


def wait_for_everyone() -> None:
    """Block until every process reaches this point (no-op in a single process)."""
    PartialState().wait_for_everyone()


def is_main_process() -> bool:
    """True on the main process of the whole run (global rank 0)."""
    return PartialState().is_main_process


def is_local_main_process() -> bool:
    """True on the main process of this machine (local rank 0)."""
    return PartialState().is_local_main_process


def on_main_process(function: Any) -> Any:
    """Decorator: run ``function`` on the main process only.

    Args:
        function: The function to wrap.
    """
    return PartialState().on_main_process(function)


def on_local_main_process(function: Any) -> Any:
    """Decorator: run ``function`` on the main process of each machine only.

    Args:
        function: The function to wrap.
    """
    return PartialState().on_local_main_process(function)


def on_last_process(function: Any) -> Any:
    """Decorator: run ``function`` on the last process only.

    Args:
        function: The function to wrap.
    """
    return PartialState().on_last_process(function)


def on_process(function: Any = None, process_index: int | None = None) -> Any:
    """Decorator: run ``function`` on the process of global index ``process_index`` only.

    Args:
        function: The function to wrap.
        process_index: Global index of the process that runs the function.
    """
    return PartialState().on_process(function, process_index=process_index)


def on_local_process(function: Any = None, local_process_index: int | None = None) -> Any:
    """Decorator: run ``function`` on the process of local index ``local_process_index`` only.

    Args:
        function: The function to wrap.
        local_process_index: Index, on its machine, of the process that runs the function.
    """
    return PartialState().on_local_process(function, local_process_index=local_process_index)


def main_process_first() -> Any:
    """Context manager: the main process runs the block first, then the others."""
    return PartialState().main_process_first()


def local_main_process_first() -> Any:
    """Context manager: each machine's main process runs the block first, then the others."""
    return PartialState().local_main_process_first()


def split_between_processes(inputs: Any, apply_padding: bool = False) -> Any:
    """Context manager giving this process its share of ``inputs`` (list, tuple, dict or tensor).

    Args:
        inputs: What to split: a list, tuple, dict of lists / tensors, or a tensor (split along its first
            dimension).
        apply_padding: Repeat the last item so every process gets the same number of items (useful before
            `gather`).
    """
    return PartialState().split_between_processes(inputs, apply_padding=apply_padding)
