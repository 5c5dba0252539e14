"""The Accelerator's saving and loading: ``save_state`` / ``load_state``, ``save``, ``save_model``.

A public component of the `Accelerator` facade: it registers the objects
a checkpoint holds and hands them to the one checkpoint walk (``checkpointing.write_objects`` /
``read_objects``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import torch

from accel_train._lazy_modules import checkpoint_file_io as io
from accel_train._lazy_modules import checkpointing as ckpt
from accel_train._lazy_modules import preemption
from accel_train.checkpoint import numbering, outcome, resume_diff, run_record
from accel_train.checkpoint.file_record import record_files
from accel_train.checkpoint.folder_lock import FolderLock
from accel_train.checkpoint.save_id import writing_as
from accel_train.components.async_saves import AsyncSaves

__all__ = ["Checkpointer", "RemovableHandle"]

logger = logging.getLogger(__name__)

#: The manifest's note that the per-process files come from the processes that called ``save_state``.
_CALLERS = "callers"


def _default_store() -> Any:
    """The key-value store of the default process group (used to hand a save's completion to the others)."""
    import torch.distributed as dist

    try:
        return dist.distributed_c10d._get_default_store()
    except (RuntimeError, ValueError, AttributeError) as error:
        raise RuntimeError(
            "save_state on several processes needs the default process group's store, which is not there: "
            "start the processes with a launcher (accel launch, torchrun)"
        ) from error


class RemovableHandle:
    """What ``register_save_state_pre_hook`` / ``register_load_state_pre_hook`` return: ``remove()`` (or
    leaving a ``with`` block) unregisters the hook (like ``torch.utils.hooks.RemovableHandle``)."""

    _next_id = 0

    def __init__(self, hooks: dict[int, Any]) -> None:
        self.hooks = hooks
        self.id = RemovableHandle._next_id
        RemovableHandle._next_id += 1

    def remove(self) -> None:
        """Unregister the hook (nothing happens the second time)."""
        self.hooks.pop(self.id, None)

    def __enter__(self) -> RemovableHandle:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()


class Checkpointer(AsyncSaves):
    """Checkpoints of the whole training state, and saving of single objects and models."""

    state: Any
    project_configuration: Any
    _models: list[Any]
    _optimizers: list[Any]
    _schedulers: list[Any]
    _dataloaders: list[Any]
    _custom_objects: list[Any]
    _save_model_state_pre_hook: dict[int, Any]
    _load_model_state_pre_hook: dict[int, Any]
    _strategy: Any
    precision: Any
    step: int
    _rewind_active_loader: bool = False
    _verify: Any = None  # the `accel verify` recorder (see Accelerator)
    #: What differed between the run that saved the last checkpoint ``load_state`` read and this run (an
    #: accel extension): one `CheckpointDifference` per setting, empty when they agree or nothing was loaded.
    checkpoint_differences: tuple[resume_diff.CheckpointDifference, ...] = ()

    # -- who writes -------------------------------------------------------------------------------

    def _is_writer(self) -> bool:
        if self.project_configuration.save_on_each_node:
            return bool(self.state.is_local_main_process)
        return bool(self.state.is_main_process)

    # -- registration -----------------------------------------------------------------------------

    def register_for_checkpointing(self, *objects: Any) -> None:
        """Save and load these objects (each with ``state_dict`` and ``load_state_dict``) with the state.

        Args:
            *objects: the objects to include in every checkpoint, in this order.

        Raises:
            ValueError: if an object lacks ``state_dict`` or ``load_state_dict``.
        """
        invalid = [
            f"{index}: {type(obj).__name__}"
            for index, obj in enumerate(objects)
            if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict"))
        ]
        if invalid:
            raise ValueError(
                "all objects registered for checkpointing need `state_dict` and `load_state_dict` methods; "
                f"these do not: {', '.join(invalid)}"
            )
        self._custom_objects.extend(objects)
        if self._verify is not None:
            self._verify.after_prepare()

    def register_save_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """Call ``hook(models, weights, output_dir)`` in ``save_state`` before the files are written.

        Args:
            hook: the callable to run; it receives the prepared models, their state dicts and the folder.

        Returns:
            A handle whose ``remove()`` unregisters the hook.
        """
        handle = RemovableHandle(self._save_model_state_pre_hook)
        self._save_model_state_pre_hook[handle.id] = hook
        return handle

    def register_load_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """Call ``hook(models, input_dir)`` in ``load_state`` before the files are read.

        Args:
            hook: the callable to run; it receives the prepared models and the checkpoint folder.

        Returns:
            A handle whose ``remove()`` unregisters the hook.
        """
        handle = RemovableHandle(self._load_model_state_pre_hook)
        self._load_model_state_pre_hook[handle.id] = hook
        return handle

    # -- save_state -------------------------------------------------------------------------------

    def _checkpoints_base(self) -> str:
        project_dir = self.project_configuration.project_dir
        if project_dir is None:
            raise ValueError(
                "automatic_checkpoint_naming needs a project folder: pass project_dir to the Accelerator "
                "or to its ProjectConfiguration"
            )
        return os.path.join(project_dir, ckpt.CHECKPOINTS_FOLDER)

    def save_state(
        self,
        output_dir: str | os.PathLike | None = None,
        safe_serialization: bool = True,
        async_save: bool | None = None,
        **save_model_func_kwargs: Any,
    ) -> str:
        """Save models, optimizers, schedulers, data-loader positions, scaler, RNG states and registered
        objects to ``output_dir`` (or ``project_dir/checkpoints/checkpoint_{n}``); returns the folder.

        The folder appears only once complete (written to a hidden sibling, then renamed).

        Args:
            output_dir: the folder to write; ignored with automatic checkpoint naming (default `None`).
            safe_serialization: write model weights as safetensors rather than pickles (default `True`).
            async_save: accel's opt-in (default `None`: ``ProjectConfiguration.async_save``, itself `False`):
                return once the state is copied into CPU memory and write it in a background thread; the
                folder is published when every process's files are written (`wait_for_checkpoint()`).
                One device, DDP and FSDP2 with sharded state dicts.
            **save_model_func_kwargs: accepted for compatibility with the documented signature; not used here.

        Returns:
            The folder the checkpoint was (or, asynchronously, will be) written to.

        Raises:
            ValueError: with automatic naming, if there is no project folder, or if ``checkpoint_<iteration>``
                or a newer checkpoint already exists (nothing is written or removed; the message says what to set);
                with ``async_save`` on a backend that cannot save asynchronously.
            AsyncCheckpointError: the asynchronous save before this one failed (this one is not started).
        """
        asynchronous = self._async_requested(async_save)
        self.wait_for_checkpoint()
        config = self.project_configuration
        if config.automatic_checkpoint_naming:
            output_dir = numbering.next_checkpoint_dir(self._checkpoints_base(), config.iteration)
        elif output_dir is None:
            raise ValueError(
                "save_state needs an `output_dir` (or a ProjectConfiguration with automatic_checkpoint_naming)"
            )
        output_dir = os.fspath(output_dir)
        writer = self._is_writer()
        alone = self._saves_alone()
        if asynchronous:
            return self._save_state_async(output_dir, writer, alone, safe_serialization)
        if alone and not writer:
            return self._add_process_files(output_dir)
        key = self._save_key(output_dir) if alone else None
        lock = FolderLock(output_dir) if writer else None
        tmp: str | None = None
        save_id = ""
        published = False
        try:
            tmp, save_id = self._begin_save(output_dir, lock, key)
            with outcome.collecting() as failures, writing_as(save_id):
                manifest = self._write_state(tmp, writer, alone, safe_serialization)
            self._settle(failures.first, key)  # every process's files are written: the folder is complete
            failure: OSError | None = None
            if writer:
                try:
                    manifest.update(save_id=save_id, files=record_files(tmp))
                    self._strategy.checkpoint_io.write_manifest(tmp, manifest)
                    ckpt.publish(tmp, output_dir, self._strategy.checkpoint_entries())
                    published = True
                except OSError as raised:
                    failure = raised
            self._settle(failure, key)
        finally:
            if lock is not None:
                if tmp is not None and not published:
                    ckpt.discard(tmp)
                lock.release()
        if key is not None:
            outcome.tell_waiters(_default_store(), key, None, save_id=save_id)
        if config.automatic_checkpoint_naming:
            if writer:
                removed = ckpt.prune(self._checkpoints_base(), config.total_limit, keep=output_dir)
                for path in removed:
                    logger.info("removed old checkpoint %s (total_limit=%s)", path, config.total_limit)
            config.iteration += 1
        logger.info("saved state to %s", output_dir)
        return output_dir

    def _begin_save(self, output_dir: str, lock: FolderLock | None, key: str | None) -> tuple[str, str]:
        """Writer: take the folder's lock and create this save's partial folder; every process of the save
        learns its path (or the writer's failure, raised everywhere). Returns the partial folder, and the
        save's id: process 0's partial-folder token (the same on every process), or the writer's own when it
        saves alone."""
        failure: OSError | None = None
        token = ""
        if lock is not None:
            try:
                os.makedirs(os.path.dirname(os.path.abspath(output_dir)), exist_ok=True)
                lock.acquire()
                token = ckpt.new_save_token()
                ckpt.begin(output_dir, token)
            except OSError as raised:
                failure = raised
        if key is not None:  # the writer saves alone: nobody else takes part
            self._settle(failure, key)
            return ckpt.partial_dir(output_dir, token), token
        tokens = outcome.agree(failure, "save_state", payload=token)
        return ckpt.partial_dir(output_dir, tokens[self._writer_rank()]), tokens[0]

    def _writer_rank(self) -> int:
        """The process that writes this process's shared files (the main one, or the node's local main)."""
        if self.project_configuration.save_on_each_node:
            return int(self.state.process_index - self.state.local_process_index)
        return 0

    def _settle(self, failure: OSError | None, key: str | None) -> None:
        """End of a step of the save: every process raises the same error if any failed (a collective), or,
        when the writer saves alone, it tells the processes waiting for the folder that it failed."""
        if key is None:
            outcome.agree(failure, "save_state")
        elif failure is not None:
            described = outcome.describe(failure) or ""
            _default_store().set(key, outcome.FAILED + described)
            error = outcome.combined_error([described], "save_state")
            raise (error or failure) from failure

    def _write_state(self, tmp: str, writer: bool, alone: bool, safe_serialization: bool) -> dict[str, Any]:
        """Write every object into the partial folder ``tmp`` (every process its part); returns the manifest."""
        to_save, manifest, loader_state = self._prepare_save(tmp, alone, safe_serialization)
        written = ckpt.write_objects(
            tmp,
            self._training_objects(),
            self._strategy,
            weights=to_save,
            is_writer=writer,
            process_index=self.state.process_index,
            safe_serialization=safe_serialization,
            loader_state=loader_state,
        )
        if writer:
            manifest.update(written)
        grads = self._accumulated_gradients()
        if grads:
            self._strategy.checkpoint_io.save_weights(
                grads, os.path.join(tmp, ckpt.grads_file(self.state.process_index))
            )
        return manifest

    def _prepare_save(
        self, tmp: str, alone: bool, safe_serialization: bool
    ) -> tuple[list[tuple[Any, Any]], dict[str, Any], Callable[[Any], dict[str, Any]]]:
        """The first part of a save on every process: the models' weights (the pre-hooks run on them and the
        partial folder ``tmp``), the manifest's own entries and how a data loader's state is taken."""
        models = list(self._models)
        strategy = self._strategy
        # Every rank takes part: a sharded strategy gathers or writes its shards here (weights None).
        weights: list[Any] = [strategy.checkpoint_weights(model) for model in models]
        sharded = any(w is None for w in weights)
        if sharded:
            weights = []
        # Hooks may take over saving a model by removing it (and its weights) from the lists.
        for hook in list(self._save_model_state_pre_hook.values()):
            hook(models, weights, tmp)
        if sharded:
            to_save = [(model, None) for model in models]
        else:
            to_save = [(models[i] if i < len(models) else None, w) for i, w in enumerate(weights)]

        manifest: dict[str, Any] = {
            **self._run_description(),
            "step": self.step,
            "safe_serialization": bool(safe_serialization),
        }
        manifest["gradient_accumulation"]["mid_accumulation"] = not self.gradient_state.sync_gradients  # type: ignore[attr-defined]
        if alone:
            manifest["process_files"] = _CALLERS
        active = self.gradient_state.active_dataloader if self._rewind_active_loader else None  # type: ignore[attr-defined]
        positions: list[dict[str, Any]] = manifest.setdefault("data", [])

        def loader_state(loader: Any) -> dict[str, Any]:
            if active is None or loader is not active:
                state = loader.state_dict()
            else:
                # Saved when a step starts (preemption): that step's batch is read again on resume.
                rewound = getattr(loader, "rewound_state_dict", None)  # prepared loaders (torchdata's too)
                state = rewound() if rewound else preemption.rewind_loader_state(loader.state_dict())
            positions.append(run_record.data_position(state, loader))
            return state

        return to_save, manifest, loader_state

    # -- saving without the other processes (unsharded strategies, explicit folder) ---------------

    def _saves_alone(self) -> bool:
        """Whether a save into an explicit folder involves no other process: with several processes whose
        strategy keeps the whole model on each (DDP), the writer saves and publishes the folder by itself,
        so that ``if accelerator.is_main_process: accelerator.save_state(path)`` works as documented; the
        processes that call it too add their own files (random states) once the folder is published.
        Automatic naming and sharded strategies keep every process in step, as documented."""
        return (
            self.state.num_processes > 1
            and self._strategy.main_process_saves_alone
            and not self.project_configuration.automatic_checkpoint_naming
        )

    def _run_description(self) -> dict[str, Any]:
        """What this run is, as the manifest records it (world size, backend, mesh, precision, versions ...)."""
        return run_record.describe_run(
            num_processes=self.state.num_processes,
            strategy=self._strategy,
            mixed_precision=self.state.mixed_precision,
            accumulation_steps=self.gradient_state.num_steps,  # type: ignore[attr-defined]
        )

    def _accumulated_gradients(self) -> dict[str, torch.Tensor] | None:
        """Mid-accumulation, the gradients gathered so far (part of the state, per process under DDP)."""
        if self.gradient_state.sync_gradients:  # type: ignore[attr-defined]
            return None
        return self._strategy.accumulated_gradients(list(self._models)) or None

    def _save_key(self, output_dir: str) -> str:
        """The store key announcing this process's next save into ``output_dir`` (per writer and count)."""
        counts: dict[str, int] = self.__dict__.setdefault("_saves_alone_counts", {})
        path = os.path.abspath(output_dir)
        counts[path] = counts.get(path, 0) + 1
        return f"accel/save_state/{self._writer_rank()}/{path}#{counts[path]}"

    def _add_process_files(self, output_dir: str) -> str:
        """A process other than the writer: once the writer has published ``output_dir``, run the pre-hooks
        (on the published folder) and add this process's random states and accumulated gradients.

        It holds the folder's lock while it writes, so a next save of the writer cannot swap the folder
        away under it; a save the writer could not finish raises the writer's error here too."""
        save_id = outcome.wait_for_writer(_default_store(), self._save_key(output_dir))  # raises the writer's error
        os.makedirs(output_dir, exist_ok=True)  # another machine's folder without a shared file system
        models = list(self._models)
        weights = [self._strategy.checkpoint_weights(model) for model in models]
        with FolderLock(output_dir), writing_as(save_id):
            for hook in list(self._save_model_state_pre_hook.values()):
                hook(models, weights, output_dir)
            io_ = self._strategy.checkpoint_io
            rank = self.state.process_index
            io.replace_file(os.path.join(output_dir, ckpt.rng_file(rank)), io_.save_rng)
            grads = self._accumulated_gradients()
            if grads:
                io.replace_file(
                    os.path.join(output_dir, ckpt.grads_file(rank)), lambda tmp: io_.save_weights(grads, tmp)
                )
        logger.info("added the files of process %d to %s", rank, output_dir)
        return output_dir

    def _training_objects(self) -> Any:
        """The registered objects, in the order a checkpoint holds them."""
        return ckpt.TrainingObjects(
            models=list(self._models),
            optimizers=list(self._optimizers),
            schedulers=list(self._schedulers),
            dataloaders=list(self._dataloaders),
            custom=list(self._custom_objects),
            scaler=self.precision,
        )

    # -- load_state -------------------------------------------------------------------------------

    def load_state(
        self,
        input_dir: str | os.PathLike | None = None,
        load_kwargs: dict[str, Any] | None = None,
        **load_model_func_kwargs: Any,
    ) -> None:
        """Restore everything `save_state()` wrote; with automatic naming and no ``input_dir``,
        the latest complete checkpoint.

        As documented, loading leaves ``project_configuration.iteration`` (the number of the next automatic
        checkpoint) alone; with ``ProjectConfiguration(continue_numbering_on_load=True)``, loading a folder
        named ``checkpoint_<n>`` raises it to at least ``n + 1``.

        Never unpickles Python objects; a folder that does not match what was prepared is an error
        that lists the missing and extra files.

        What differs between the run that saved and this one (world size, backend and its settings, mesh,
        precision, accumulation steps, library versions) is logged, one INFO line each
        (``resume: num_processes 2 -> 1``), and kept in ``checkpoint_differences`` (an accel extension).

        Args:
            input_dir: the checkpoint folder; `None` loads the latest one with automatic naming.
            load_kwargs: options for loading optimizer states, such as ``map_location`` (default `None`).
            **load_model_func_kwargs: options for loading the model weights: ``map_location`` and
                ``strict`` (default `True`).

        Raises:
            ValueError: if ``input_dir`` is missing without automatic naming, or the folder does not match.
            FileNotFoundError: with automatic naming, if there is no complete checkpoint to load.
            AsyncCheckpointError: the asynchronous save in flight failed (nothing is loaded).
        """
        self.wait_for_checkpoint()  # an asynchronous save in flight may be the folder to load
        config = self.project_configuration
        if input_dir is None:
            if not config.automatic_checkpoint_naming:
                raise ValueError(
                    "load_state needs an `input_dir` (or a ProjectConfiguration with automatic_checkpoint_naming)"
                )
            found = numbering.list_checkpoints(self._checkpoints_base())
            if not found:
                raise FileNotFoundError(f"no complete checkpoint in {self._checkpoints_base()} to load")
            input_dir = found[-1][1]
        else:
            input_dir = os.fspath(input_dir)
        folder = ckpt.resolve_input_dir(input_dir)

        models = list(self._models)
        for hook in list(self._load_model_state_pre_hook.values()):
            hook(models, folder)

        strategy = self._strategy
        io_ = strategy.checkpoint_io
        manifest = io_.read_manifest(folder)
        self._report_differences(manifest)
        objects = self._training_objects()
        dataloaders = [loader for loader in objects.dataloaders if hasattr(loader, "load_state_dict")]
        model_files = ckpt.check_contents(
            folder,
            num_models=len(models),
            num_optimizers=len(self._optimizers),
            num_schedulers=len(self._schedulers),
            num_dataloaders=len(dataloaders),
            num_custom=len(self._custom_objects),
            has_scaler=self.precision.state_dict() is not None,
            process_index=self.state.process_index,
            num_processes=self.state.num_processes,
            manifest=manifest,
            layout=strategy.checkpoint_entries(),
        )
        saved_processes = manifest.get("num_processes") if manifest else None
        grads_files = [e for e in os.listdir(folder) if e.startswith(f"{ckpt.FILE_NAMES['grads']}_")]
        if grads_files and saved_processes not in (None, self.state.num_processes):
            raise ValueError(
                f"checkpoint {folder} was saved between two optimizer steps of gradient accumulation by "
                f"{saved_processes} processes ({grads_files[0]} ...): each process's gradients gathered so far are "
                f"its own, so it resumes only on {saved_processes} processes, not {self.state.num_processes}. "
                "Resume there, or save after the optimizer step of a sync step (accelerator.sync_gradients)"
            )
        map_location = load_model_func_kwargs.pop("map_location", None)
        device = ckpt.torch_device(map_location, self.state.device)
        ckpt.read_objects(
            folder,
            objects,
            strategy,
            model_entries=model_files,
            device=device,
            optimizer_location=dict(load_kwargs or {}).get("map_location", device),
            process_index=self.state.process_index,
            strict=load_model_func_kwargs.pop("strict", True),
            distributed=True,
            manifest=manifest,
        )
        grads_path = os.path.join(folder, ckpt.grads_file(self.state.process_index))
        strategy.restore_gradients(models, io_.load_weights(grads_path, device) if os.path.isfile(grads_path) else None)
        if manifest is not None and isinstance(manifest.get("step"), int):
            self.step = manifest["step"]
        if config.continue_numbering_on_load:  # accel's opt-in; as documented, loading leaves it alone
            config.iteration = numbering.continued_iteration(config.iteration, input_dir)
        logger.info("loaded state from %s", folder)
        if self._verify is not None:  # `accel verify --resume-at` follows the script's own resume
            self._verify.on_load_state()

    def _report_differences(self, manifest: dict[str, Any] | None) -> None:
        """Compare the checkpoint's manifest with this run: one INFO line per difference (on the main process),
        and ``checkpoint_differences`` on every process."""
        found = tuple(resume_diff.differences(manifest, self._run_description()))
        self.checkpoint_differences = found
        if self.state.is_main_process:
            for difference in found:
                logger.info("%s", difference)

    # -- single objects and models ------------------------------------------------------------------

    def save(self, obj: Any, f: str | os.PathLike, safe_serialization: bool = False) -> None:
        """Save ``obj`` once per machine (or once in all with the default), replacing ``f`` atomically.

        Args:
            obj: the object to save (e.g. a state dict).
            f: the path of the file to write.
            safe_serialization: write with safetensors instead of ``torch.save`` (default `False`).
        """
        if not self._is_writer():
            return

        def write(tmp: str) -> None:
            if safe_serialization:
                io.save_weights(obj, tmp, safe_serialization=True)  # shared tensors stored once, and logged
            else:
                io.save_torch(obj, tmp)

        io.replace_file(os.fspath(f), write)

    def save_model(
        self,
        model: torch.nn.Module,
        save_directory: str | os.PathLike,
        max_shard_size: int | str = "10GB",
        safe_serialization: bool = True,
    ) -> None:
        """Write the model's weights as (sharded) safetensors with an index, loadable by
        ``load_checkpoint_in_model`` / ``load_checkpoint_and_dispatch``.

        Args:
            model: the model to save (prepared or not; it is unwrapped).
            save_directory: the folder to write the weights to.
            max_shard_size: the largest size of one weight file, as bytes or a string like ``"5GB"``
                (default `"10GB"`).
            safe_serialization: write safetensors rather than pickles (default `True`).

        Raises:
            ValueError: if ``save_directory`` is a file.
        """
        save_directory = os.fspath(save_directory)
        if os.path.isfile(save_directory):
            raise ValueError(f"save_model needs a folder, but {save_directory} is a file")
        state_dict = self.get_state_dict(model)  # type: ignore[attr-defined]
        if self._is_writer():
            from accel_bigmodel.sharding import save_sharded

            os.makedirs(save_directory, exist_ok=True)
            save_sharded(
                state_dict, save_directory, max_shard_size=max_shard_size, safe_serialization=safe_serialization
            )
        self.state.wait_for_everyone()
