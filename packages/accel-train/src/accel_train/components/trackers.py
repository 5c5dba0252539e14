"""The Accelerator's experiment trackers, through accel-tracking.

A public component of the `Accelerator` facade.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Trackers"]


def _tracking() -> Any:
    from accel_tracking import tracking

    return tracking


class Trackers:
    """``init_trackers``, ``log``, ``get_tracker`` and ``end_training``."""

    state: Any
    trackers: list[Any]
    log_with: list[Any]
    project_configuration: Any

    def _filter_trackers(self, log_with: Any) -> list[Any]:
        if log_with is None:
            return []
        return list(_tracking().filter_trackers(log_with, self.project_configuration.logging_dir))

    def init_trackers(self, project_name: str, config: dict | None = None, init_kwargs: dict | None = None) -> None:
        """Start every tracker of ``log_with`` for ``project_name`` (on the main process by default).

        Args:
            project_name: name of the run / project in the trackers.
            config: hyper-parameters to store once.
            init_kwargs: per-tracker keyword arguments, ``{"wandb": {"tags": [...]}}``.
        """
        tracking = _tracking()
        init_kwargs = dict(init_kwargs or {})
        known = {str(getattr(t, "name", t)) for t in self.log_with}
        unknown = sorted(set(init_kwargs) - known)
        if unknown:
            raise ValueError(f"init_kwargs names trackers {unknown} that are not in log_with ({sorted(known)})")
        self.trackers = []
        for entry in self.log_with:
            if isinstance(entry, tracking.GeneralTracker):
                tracker = entry
            else:
                cls = tracking.LOGGER_TYPE_TO_CLASS[str(entry)]
                kwargs = init_kwargs.get(str(entry), {})
                if getattr(cls, "requires_logging_directory", False):
                    tracker = cls(project_name, self.project_configuration.logging_dir, **kwargs)
                else:
                    tracker = cls(project_name, **kwargs)
            self.trackers.append(tracker)
        active = [t for t in self.trackers if self.state.is_main_process or not getattr(t, "main_process_only", True)]
        tracking.start_all(active)
        if config is not None:
            tracking.store_config_to_all(active, config)

    def get_tracker(self, name: str, unwrap: bool = False) -> Any:
        """The tracker called ``name`` (its backend object with ``unwrap``); a blank one elsewhere.

        Args:
            name: the name of a started tracker (e.g. ``"wandb"``, ``"tensorboard"``).
            unwrap: return the tracker's underlying backend object instead of the wrapper (default `False`).

        Returns:
            The tracker, its backend object, or a blank tracker on processes that do not log.

        Raises:
            ValueError: on the main process, if no started tracker has this name.
        """
        for tracker in self.trackers:
            if tracker.name == name:
                return tracker.tracker if unwrap else tracker
        if not self.state.is_main_process:
            return _tracking().GeneralTracker(_blank=True)
        raise ValueError(
            f"{name} is not an available tracker stored inside the Accelerator; started: {[t.name for t in self.trackers]}"
        )

    def log(self, values: dict, step: int | None = None, log_kwargs: dict | None = None) -> None:
        """Log ``values`` at ``step`` to every tracker (main process by default).

        Args:
            values: the names and values to log.
            step: the step number to log them at (default `None`).
            log_kwargs: per-tracker keyword arguments, keyed by tracker name (default `None`).
        """
        if not self.trackers:
            return
        # Each tracker logs even when another fails; the error names the failing tracker(s).
        _tracking().log_to_all(self.trackers, values, step=step, log_kwargs=log_kwargs or {})

    def end_training(self) -> None:
        """Wait for an asynchronous save in flight (raising its failure), finish every tracker, then end the
        process group this run started; call it at the end."""
        wait = getattr(self, "wait_for_checkpoint", None)
        if wait is not None:
            wait()
        if self.trackers:
            _tracking().finish_all(self.trackers)
        self.state.wait_for_everyone()
        self.state._partial.destroy_process_group()
