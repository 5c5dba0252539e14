"""Plugins and configurations of the Accelerator: gradient accumulation, torch.compile, the project.

Each is a dataclass validated in ``__post_init__``; a wrong value names the field and what is allowed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from accel_state import env_vars
from accel_state.enums import DynamoBackend
from accel_state.kwargs import KwargsHandler

__all__ = ["GradientAccumulationPlugin", "ProjectConfiguration", "TorchDynamoPlugin"]


@dataclass
class GradientAccumulationPlugin(KwargsHandler):
    """How gradients accumulate.

    Args:
        num_steps: batches per optimizer step (``ACCELERATE_GRADIENT_ACCUMULATION_STEPS`` when None).
        adjust_scheduler: advance the scheduler's step count on accumulation steps too.
        sync_with_dataloader: sync (and step) on the last batch of the loader even mid-accumulation.
        sync_each_batch: sync gradients every batch (less memory under DDP/FSDP, more traffic).
    """

    num_steps: int | None = None
    adjust_scheduler: bool = True
    sync_with_dataloader: bool = True
    sync_each_batch: bool = False

    def __post_init__(self) -> None:
        if self.num_steps is None:
            self.num_steps = int(env_vars.read("ACCELERATE_GRADIENT_ACCUMULATION_STEPS"))
        if isinstance(self.num_steps, bool) or not isinstance(self.num_steps, int) or self.num_steps < 1:
            raise ValueError(f"GradientAccumulationPlugin.num_steps must be an int >= 1, got {self.num_steps!r}")
        for name in ("adjust_scheduler", "sync_with_dataloader", "sync_each_batch"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"GradientAccumulationPlugin.{name} must be a bool, got {getattr(self, name)!r}")


_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@dataclass
class TorchDynamoPlugin(KwargsHandler):
    """``torch.compile`` settings; fields left None come from the ``ACCELERATE_DYNAMO_*`` variables.

    Args:
        backend: Compiler backend, a ``DynamoBackend`` name such as `inductor` (any case), or `no` to not
            compile. Defaults to `None` (launcher value, else `no`).
        mode: ``torch.compile`` mode: `default`, `reduce-overhead`, `max-autotune` or
            `max-autotune-no-cudagraphs`. Defaults to `None` (launcher value, else `default`).
        fullgraph: Whether the whole model must compile as one graph (graph breaks are errors).
            Defaults to `None` (launcher value, else `False`).
        dynamic: Whether shapes are treated as dynamic; `None` lets torch decide. Defaults to `None`
            (launcher value when set).
        options: Backend options dict passed to ``torch.compile``; cannot be combined with a ``mode`` other than
            `default`. Defaults to `None`.
        disable: Whether compilation is turned off whatever the backend. Defaults to `False`.
        use_regional_compilation: Whether repeated blocks of the model are compiled once each instead of the whole
            model. Defaults to `None` (launcher value, else `False`).
    """

    backend: Any = None
    mode: str | None = None
    fullgraph: bool | None = None
    dynamic: bool | None = None
    options: Any = None
    disable: bool = False
    use_regional_compilation: bool | None = None

    def __post_init__(self) -> None:
        if self.backend is None:
            self.backend = env_vars.read("ACCELERATE_DYNAMO_BACKEND")
        self.backend = DynamoBackend.parse(self.backend)
        if self.mode is None:
            self.mode = env_vars.read("ACCELERATE_DYNAMO_MODE")
        if self.mode not in _MODES:
            raise ValueError(f"TorchDynamoPlugin.mode={self.mode!r} is not valid; choose one of {list(_MODES)}")
        if self.fullgraph is None:
            self.fullgraph = env_vars.read("ACCELERATE_DYNAMO_USE_FULLGRAPH")
        if self.dynamic is None and os.environ.get("ACCELERATE_DYNAMO_USE_DYNAMIC"):
            self.dynamic = env_vars.read("ACCELERATE_DYNAMO_USE_DYNAMIC")
        if self.use_regional_compilation is None:
            self.use_regional_compilation = env_vars.read("ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION")
        if self.options is not None and self.mode != "default":
            raise ValueError(
                "TorchDynamoPlugin: give either `mode` or `options`, not both (torch.compile refuses both)"
            )

    @property
    def enabled(self) -> bool:
        """Whether the model is compiled: a backend other than `no` and ``disable`` left `False`."""
        return self.backend != DynamoBackend.NO and not self.disable

    def to_dict(self) -> dict[str, Any]:
        """Every field, with the backend as a lower-case string (``"inductor"``)."""
        values = super().to_dict()
        values["backend"] = str(DynamoBackend.parse(values["backend"]).value).lower()
        return values

    def to_kwargs(self) -> dict[str, Any]:
        """The settings changed from the defaults, those read from ``ACCELERATE_DYNAMO_*`` included;
        ``use_regional_compilation`` is accel's own business and never part of it."""
        kwargs = super().to_kwargs()
        kwargs.pop("use_regional_compilation", None)
        return kwargs

    def to_compile_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``torch.compile``."""
        kwargs: dict[str, Any] = {"backend": str(self.backend.value).lower(), "fullgraph": bool(self.fullgraph)}
        if self.options is not None:
            kwargs["options"] = self.options
        else:
            kwargs["mode"] = self.mode
        if self.dynamic is not None:
            kwargs["dynamic"] = self.dynamic
        return kwargs


@dataclass
class ProjectConfiguration:
    """Where a project keeps its logs and checkpoints, and how checkpoints are named and kept.

    Args:
        project_dir: base folder of the project (checkpoints go to ``project_dir/checkpoints``).
        logging_dir: folder of local tracker logs (defaults to ``project_dir``).
        automatic_checkpoint_naming: save to ``checkpoints/checkpoint_{iteration}``.
        total_limit: keep at most this many automatic checkpoints (oldest complete ones removed).
        iteration: number of the next automatic checkpoint. As in the documented system, only
            ``save_state()`` advances it; ``load_state()`` leaves it alone, so a run that loads
            ``checkpoint_3`` of its own project and then saves must set it (or opt in below), or the
            save stops with an error naming the folder that already exists.
        save_on_each_node: every machine writes its own copy (no shared filesystem).
        save_on_preemption: when the job is asked to stop (SIGTERM, as SLURM and cloud schedulers
            send before they preempt it), finish the current step on every process, save a checkpoint
            with ``save_state()`` and exit with status 143 (the scheduler's "terminated, requeue");
            the next run continues from it with ``load_state()``. Needs ``automatic_checkpoint_naming``
            and ``continue_numbering_on_load`` (a resumed run must not save onto the checkpoint it loaded).
        continue_numbering_on_load: accel's opt-in (default `False`, the documented behaviour): when
            ``load_state()`` loads a folder named ``checkpoint_<n>``, ``iteration`` becomes at least
            ``n + 1``, so a restarted run's next ``save_state()`` writes ``checkpoint_<n+1>`` instead of
            colliding with an existing ``checkpoint_0``.
        async_save: accel's opt-in (default `False`, the documented behaviour: ``save_state()`` returns once
            the checkpoint is written): every ``save_state()`` that does not say otherwise copies the state
            into CPU memory, returns, and writes it in a background thread (``save_state(async_save=...)``
            overrides it per call; ``accelerator.wait_for_checkpoint()`` waits for the write). One device,
            DDP and FSDP2 with sharded state dicts.
    """

    project_dir: str | None = None
    logging_dir: str | None = None
    automatic_checkpoint_naming: bool = False
    total_limit: int | None = None
    iteration: int = 0
    save_on_each_node: bool = False
    save_on_preemption: bool = False
    continue_numbering_on_load: bool = False
    async_save: bool = False

    def __post_init__(self) -> None:
        if self.project_dir is not None:
            self.project_dir = os.fspath(self.project_dir)
        if self.logging_dir is None:
            self.logging_dir = self.project_dir
        else:
            self.logging_dir = os.fspath(self.logging_dir)
        if self.total_limit is not None and (not isinstance(self.total_limit, int) or self.total_limit < 1):
            raise ValueError(f"ProjectConfiguration.total_limit must be an int >= 1 or None, got {self.total_limit!r}")
        if not isinstance(self.iteration, int) or self.iteration < 0:
            raise ValueError(f"ProjectConfiguration.iteration must be an int >= 0, got {self.iteration!r}")
        if not isinstance(self.save_on_preemption, bool):
            raise TypeError(f"ProjectConfiguration.save_on_preemption must be a bool, got {self.save_on_preemption!r}")
        if not isinstance(self.continue_numbering_on_load, bool):
            raise TypeError(
                "ProjectConfiguration.continue_numbering_on_load must be a bool, "
                f"got {self.continue_numbering_on_load!r}"
            )
        if not isinstance(self.async_save, bool):
            raise TypeError(f"ProjectConfiguration.async_save must be a bool, got {self.async_save!r}")
        if self.save_on_preemption and not self.automatic_checkpoint_naming:
            raise ValueError(
                "ProjectConfiguration.save_on_preemption needs automatic_checkpoint_naming=True (and a project_dir): "
                "the checkpoint taken on preemption goes to project_dir/checkpoints/checkpoint_{n}, where "
                "load_state() finds it on the next run"
            )
        if self.save_on_preemption and not self.continue_numbering_on_load:
            raise ValueError(
                "ProjectConfiguration.save_on_preemption needs continue_numbering_on_load=True: the resumed run "
                "loads checkpoint_{n} with load_state() and, if preempted again, must save checkpoint_{n+1}; "
                "with the documented numbering (load_state() leaves `iteration` alone) that save would stop "
                "on the existing checkpoint_0"
            )

    def set_directories(self, project_dir: str | os.PathLike | None = None) -> None:
        """Set ``project_dir`` (and ``logging_dir`` when it followed it).

        Args:
            project_dir: New base folder of the project; `None` clears it. Defaults to `None`.
        """
        follow = self.logging_dir is None or self.logging_dir == self.project_dir
        self.project_dir = None if project_dir is None else os.fspath(project_dir)
        if follow:
            self.logging_dir = self.project_dir
