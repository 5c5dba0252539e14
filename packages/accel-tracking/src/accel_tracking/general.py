"""The tracker contract (``GeneralTracker``), the main-process gate and the base of the built-in trackers."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
import os
from collections.abc import Callable
from typing import Any, TypeVar

from accel_state.install_hints import install_hint
from accel_tracking.values import normalize_config, normalize_values, to_python

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])


def _is_main_process() -> bool:
    """Whether this process is the run's main process.

    With torch installed, ``PartialState`` decides (it knows the process group and the launcher's
    variables). Without torch (accel-tracking and accel-state installed with ``--no-deps``, for the
    dependency-free trackers), the launchers' rank variables decide: rank 0, or no launcher, is main.
    """
    if importlib.util.find_spec("torch") is None:
        from accel_state.environment import get_cpu_distributed_information

        return get_cpu_distributed_information()["rank"] == 0
    from accel_state.state import PartialState

    return bool(PartialState().is_main_process)


def on_main_process(function: F) -> F:
    """Decorate a tracker method so that it runs on the main process only.

    The check happens at call time (not when the class is defined) and reads the instance's
    ``main_process_only`` attribute: a tracker that sets it to ``False`` runs the method on every process.
    On other processes the method returns ``None``.

    Args:
        function: The tracker method to wrap.
    """

    @functools.wraps(function)
    def gated(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "main_process_only", True) and not _is_main_process():
            return None
        return function(self, *args, **kwargs)

    return gated  # type: ignore[return-value]


class GeneralTracker:
    """Base class of every tracker, built in or written by a user.

    A subclass defines three things: ``name`` (a unique string such as ``"wandb"``),
    ``requires_logging_directory`` (whether ``__init__`` takes a ``logging_dir``) and a ``tracker``
    property returning the backend's own run object. It implements ``store_init_configuration(values)``
    and ``log(values, step=None, **kwargs)`` and, when the backend needs it, ``start()`` (called once
    before the first use) and ``finish()``. ``main_process_only`` (default ``True``) says whether the
    methods decorated with `on_main_process()` run on the main process only.
    """

    main_process_only: bool = True
    # Declared for type checkers only: a subclass must set them (checked in __init__).
    name: str
    requires_logging_directory: bool

    def __init__(self, _blank: bool = False) -> None:
        self._blank = _blank
        if _blank:
            return
        missing = [
            attr
            for attr, present in (
                ("name", hasattr(self, "name")),
                ("requires_logging_directory", hasattr(self, "requires_logging_directory")),
                ("tracker", "tracker" in dir(self)),
            )
            if not present
        ]
        if missing:
            raise NotImplementedError(
                f"The tracker class {type(self).__name__} is missing required attributes: "
                + ", ".join(f"`{m}`" for m in missing)
                + ". Define `name` (str) and `requires_logging_directory` (bool) on the class, and `tracker` as a property."
            )

    def __getattr__(self, attr: str) -> Any:
        # A blank tracker (what other processes get from get_tracker) answers `tracker` with None.
        if attr == "tracker" and self.__dict__.get("_blank", False):
            return None
        raise AttributeError(f"{type(self).__name__!s} object has no attribute {attr!r}")

    def start(self) -> None:
        """Create the backend's run; the Accelerator calls it once, after the process group exists."""

    def store_init_configuration(self, values: dict) -> None:
        """Store ``values`` as the run's hyper-parameters (once, at the start).

        Args:
            values: The hyper-parameters, as a dict.
        """

    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Log ``values`` (name -> number or text) for ``step``.

        Args:
            values: Name -> value to log.
            step: The step these values belong to; `None` lets the backend count.
            **kwargs: Extra keyword arguments passed on to the backend's own call.
        """

    def finish(self) -> None:
        """Close the run and flush what is pending; a tracker with nothing to close keeps this no-op."""


def as_step(step: Any) -> int | None:
    """``step`` as an int (a tensor or numpy integer is accepted); anything else is a clear error."""
    if step is None or (isinstance(step, int) and not isinstance(step, bool)):
        return step
    value = to_python(step)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise TypeError(f"`step` must be an integer (or None), got {type(step).__name__}: {step!r:.100}")


def is_backend_available(extra: str) -> bool:
    """Whether the library behind the tracker of that name (extra) is installed (metadata only, no import)."""
    from accel_state import imports

    check = getattr(imports, f"is_{extra}_available", None)
    return bool(check()) if check is not None else True


class BackendTracker(GeneralTracker):
    """Shared life cycle of the built-in trackers.

    ``__init__`` only records arguments (so a tracker can be built before the process group exists);
    the backend's run is created by ``start()``, or on first use. Every public method runs on the main
    process only, converts tensors and numpy scalars to numbers, and accepts configs of any JSON-able
    shape. ``finish()`` may be called any number of times. Subclasses implement ``_start``,
    ``_store_config``, ``_log`` and ``_finish``; ``extra`` names both the extra and the availability check.
    """

    extra: str = ""
    library: str = ""

    def __init__(self, run_name: str | None, **kwargs: Any) -> None:
        super().__init__()
        if self.extra:
            require_installed(self)
        self.run_name = run_name
        self.init_kwargs = kwargs
        self._run: Any = None
        self._skipped: set[str] = set()
        self._started = False
        self._finished = False

    # Life cycle -----------------------------------------------------------------------------------

    @on_main_process
    def start(self) -> None:
        """Create the backend's run (idempotent)."""
        self._ensure_started()

    def _ensure_started(self) -> Any:
        if self._finished:
            raise RuntimeError(
                f"The {self.name} tracker of run {self.run_name!r} is finished; create a new tracker "
                "(accelerator.init_trackers) to log again."
            )
        if not self._started:
            self._run = self._start()
            self._started = True
        return self._run

    @property
    def tracker(self) -> Any:
        """The backend's own run object (``None`` on processes where this tracker does not run)."""
        if self.main_process_only and not _is_main_process():
            return None
        if self._finished:
            return self._run
        return self._ensure_started()

    @on_main_process
    def store_init_configuration(self, values: dict) -> None:
        """Store ``values`` (any JSON-able shape) as the run's hyper-parameters.

        Args:
            values: The hyper-parameters: any JSON-able dict.
        """
        config = normalize_config(values)
        self._ensure_started()
        self._store_config(config)

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Log ``values`` for ``step``; tensors and numpy scalars are logged as Python numbers.

        Args:
            values: Name -> value to log.
            step: The step these values belong to; `None` lets the backend count.
            **kwargs: Extra keyword arguments passed on to the backend's own call.
        """
        step = as_step(step)
        clean = normalize_values(values)
        self._ensure_started()
        self._log(clean, step, **kwargs)

    @on_main_process
    def finish(self) -> None:
        """Close the run; calling it again (or before anything was logged) does nothing."""
        if self._finished:
            return
        self._finished = True
        if self._started:
            self._finish()

    # What each backend implements ----------------------------------------------------------------

    def _start(self) -> Any:
        raise NotImplementedError

    def _store_config(self, config: dict[str, Any]) -> None:
        raise NotImplementedError

    def _log(self, values: dict[str, Any], step: int | None, **kwargs: Any) -> None:
        raise NotImplementedError

    def _finish(self) -> None:
        pass

    def _import(self, module: str) -> Any:
        """Import ``module`` of this tracker's library (checked installed, with the extra named if not)."""
        require_installed(self)
        return importlib.import_module(module)

    def _skip(self, key: str, value: Any, accepted: str) -> None:
        if key in self._skipped:  # warn once per key, not at every step
            return
        self._skipped.add(key)
        logger.warning(
            "The %s tracker accepts %s; skipped %r (a %s). Log it with another tracker or convert it first.",
            self.name,
            accepted,
            key,
            type(value).__name__,
        )


def require_installed(tracker: BackendTracker) -> None:
    """Raise the ImportError naming the extra when ``tracker``'s library is absent."""
    if not is_backend_available(tracker.extra):
        raise ImportError(
            f"The {tracker.name} tracker needs the `{tracker.library or tracker.extra}` library, which is not "
            f"installed: {install_hint('accel-tracking', tracker.extra)}"
        )


def resolve_dir(logging_dir: str | os.PathLike | None, run_name: str | None = None) -> str | None:
    """``logging_dir`` as a string (joined with ``run_name`` when given); ``None`` stays ``None``."""
    if logging_dir is None:
        return None
    path = os.fspath(logging_dir)
    return os.path.join(path, run_name) if run_name else path
