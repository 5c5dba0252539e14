"""A logger that, in a multi-process run, logs on the main process only unless told otherwise."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import MutableMapping
from typing import Any


class MultiProcessAdapter(logging.LoggerAdapter):  # type: ignore[type-arg]
    """Logger adapter taking ``main_process_only`` (default True) and ``in_order`` per call."""

    @staticmethod
    def _should_log(main_process_only: bool) -> bool:
        from accel_state.state import PartialState, is_initialized

        if not is_initialized():
            return True
        state = PartialState()
        return not main_process_only or state.is_main_process

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        """Log ``msg`` on the main process (``main_process_only=False``: on all; ``in_order=True``: rank by rank).

        Args:
            level: The logging level (`logging.INFO`, ...).
            msg: The message, as for `logging.Logger.log`.
            *args: Arguments merged into `msg`.
            **kwargs: `main_process_only` (default `True`) and `in_order` (default `False`) choose which
                processes log; the rest go to `logging.Logger.log`.
        """
        main_process_only = kwargs.pop("main_process_only", True)
        in_order = kwargs.pop("in_order", False)
        kwargs.setdefault("stacklevel", 2)
        if not self.isEnabledFor(level):
            return
        if in_order:
            from accel_state.state import PartialState, is_initialized

            if is_initialized() and PartialState().num_processes > 1:
                state = PartialState()
                for rank in range(state.num_processes):
                    if rank == state.process_index:
                        msg2, kwargs2 = self.process(msg, kwargs)
                        self.logger.log(level, msg2, *args, **dict(kwargs2))
                    state.wait_for_everyone()
                return
        if self._should_log(main_process_only):
            out_msg, out_kwargs = self.process(msg, kwargs)
            self.logger.log(level, out_msg, *args, **dict(out_kwargs))

    @functools.lru_cache(None)  # noqa: B019  (deliberately caches per message)
    def warning_once(self, *args: Any, **kwargs: Any) -> None:
        """``warning`` that prints a given message only once."""
        self.warning(*args, **kwargs)

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        """Prefix nothing; pass the message and keyword arguments on as they are (the `LoggerAdapter` hook).

        Args:
            msg: The log message.
            **kwargs: The keyword arguments of the logging call.
        """
        return msg, kwargs


def get_logger(name: str, log_level: str | None = None) -> MultiProcessAdapter:
    """A logger for ``name``; level from ``log_level`` or ``ACCELERATE_LOG_LEVEL``.

    Args:
        name: Name of the logger, usually `__name__`.
        log_level: Its level; `None` reads `ACCELERATE_LOG_LEVEL` (else the root logger's).
    """
    level = log_level or os.environ.get("ACCELERATE_LOG_LEVEL")
    logger = logging.getLogger(name)
    if level is not None:
        logger.setLevel(level.upper())
        logger.root.setLevel(level.upper())
    return MultiProcessAdapter(logger, {})
