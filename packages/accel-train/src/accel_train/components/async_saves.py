"""Asynchronous ``save_state`` (accel's opt-in): stage on the training thread, write in the background.

Part of the Accelerator's `Checkpointer`. ``save_state(..., async_save=True)`` (or
``ProjectConfiguration(async_save=True)``) takes the partial folder and the lock as the synchronous save
does, copies the state into CPU memory (`accel_train.checkpoint.staging`) and returns; a thread then
writes the copy with the same walk (``write_objects``) and publishes the folder with the same atomic swap
once every process's files are there, then applies ``total_limit``. The processes of the save agree
through the default store (`accel_train.checkpoint.background`), not through collectives, so the
training loop keeps the process group to itself; a sharded strategy's DCP writes run on a gloo group of
their own (`background.using_side_group`). One save is in flight at a time: the next
``save_state``, ``load_state``, ``end_training`` and ``wait_for_checkpoint()`` wait for it and raise
`AsyncCheckpointError` if it failed; interpreter exit waits for it too.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from accel_train._lazy_modules import checkpointing as ckpt
from accel_train.checkpoint import background, outcome
from accel_train.checkpoint.background import AsyncCheckpointError, BackgroundSave
from accel_train.checkpoint.file_record import record_files
from accel_train.checkpoint.folder_lock import FolderLock
from accel_train.checkpoint.save_id import writing_as

if TYPE_CHECKING:
    from accel_train.checkpoint.staging import StagedState

__all__ = ["SUPPORTED", "AsyncCheckpointError", "AsyncSaves"]

logger = logging.getLogger(__name__)

#: The backends whose state an asynchronous save can stage (`Strategy.async_save_refusal()` is `None`),
#: for messages: one device and DDP (every process holds the whole state), and FSDP2's sharded state
#: (each process copies its shards; torch.distributed.checkpoint writes them on a gloo group of its own).
#: DeepSpeed's engine, FSDP1, the mesh, pipeline stages, Megatron-LM and XLA write synchronously.
SUPPORTED = "one device, DDP, and FSDP2 with state_dict_type='SHARDED_STATE_DICT'"


class AsyncSaves:
    """The asynchronous half of the checkpointer (a mixin of `Checkpointer`)."""

    state: Any
    project_configuration: Any
    _strategy: Any
    #: The asynchronous save in flight (`None`: none); `wait_for_checkpoint()` takes it.
    _pending_save: BackgroundSave | None = None

    # -- waiting ----------------------------------------------------------------------------------

    def wait_for_checkpoint(self) -> str | None:
        """Wait for the asynchronous ``save_state`` in flight, if any, to be written and published.

        Returns:
            The published checkpoint folder, or `None` when no asynchronous save was in flight.

        Raises:
            AsyncCheckpointError: the save failed (on every process of the save); the folder was not
                published, and a checkpoint that was there before is unchanged.
        """
        pending: BackgroundSave | None = self.__dict__.pop("_pending_save", None)
        iteration = self.__dict__.pop("_pending_iteration", None)
        if pending is None:
            return None
        try:
            return pending.wait()
        except AsyncCheckpointError:
            if iteration is not None:  # the number of the failed automatic checkpoint is free again
                self.project_configuration.iteration = iteration
            raise

    def _async_requested(self, async_save: bool | None) -> bool:
        """Whether this save is asynchronous (the argument, else the project configuration's setting)."""
        value = getattr(self.project_configuration, "async_save", False) if async_save is None else async_save
        if not isinstance(value, bool):
            raise TypeError(f"save_state's async_save must be True, False or None, got {value!r}")
        refusal = self._strategy.async_save_refusal() if value else None
        if refusal is not None:
            raise ValueError(
                f"save_state(async_save=True) is not supported with the {self._strategy.name!r} backend: {refusal}. "
                f"An asynchronous save supports {SUPPORTED}. Save synchronously here (async_save=False, and "
                "ProjectConfiguration(async_save=False))"
            )
        return value

    # -- saving -----------------------------------------------------------------------------------

    def _save_state_async(self, output_dir: str, writer: bool, alone: bool, safe_serialization: bool) -> str:
        """Stage this process's part of the save of ``output_dir`` and start writing it; returns the folder."""
        from accel_train.checkpoint.staging import stage_objects

        if alone and not writer:
            return self._add_process_files_async(output_dir)
        key = self._save_key(output_dir) if alone else None  # type: ignore[attr-defined]
        lock = FolderLock(output_dir) if writer else None
        store = self._store_if_distributed()
        strategy = self._strategy
        side_group = self._side_group()
        tmp: str | None = None
        save_id = ""
        try:
            tmp, save_id = self._begin_save(output_dir, lock, key)  # type: ignore[attr-defined]
            to_save, manifest, loader_state = self._prepare_save(tmp, alone, safe_serialization)  # type: ignore[attr-defined]
            sharded = any(weights is None for _, weights in to_save)
            if sharded:  # every process copies its own shards (the synchronous save reads them while writing)
                to_save = [(model, strategy.staged_shards(model)) for model, _ in to_save]
            staged = stage_objects(
                self._training_objects(),  # type: ignore[attr-defined]
                weights=to_save,
                is_writer=writer,
                optimizer_state=strategy.staged_optimizer_state,
                loader_state=loader_state,
                grads=self._accumulated_gradients(),  # type: ignore[attr-defined]
                reuse=self.__dict__.pop("_staging_memory", None),
                sharded=sharded,
            )
            self.__dict__["_staging_memory"] = staged.storages  # the next save copies into it (this one is written)
        except BaseException as error:
            if lock is not None and lock.held:
                if tmp is not None:
                    ckpt.discard(tmp)
                lock.release()
            if tmp is not None and store is not None:  # the others of the save are past its start: tell them
                if key is not None:
                    outcome.tell_waiters(store, key, error)
                else:
                    background.announce(store, self._done_key(save_id, output_dir, self.state.process_index), error)
            raise

        def job() -> None:
            with background.using_side_group(side_group):
                self._write_staged(output_dir, tmp, staged, manifest, writer, key, save_id, lock, store)

        return self._start(output_dir, job)

    def _write_staged(
        self,
        output_dir: str,
        tmp: str,
        staged: StagedState,
        manifest: dict[str, Any],
        writer: bool,
        key: str | None,
        save_id: str,
        lock: FolderLock | None,
        store: Any,
    ) -> None:
        """The background thread: write the staged state into ``tmp``, agree, publish (writer), prune."""
        rank = self.state.process_index
        strategy = self._strategy
        with outcome.collecting() as failures, writing_as(save_id):
            try:
                written = ckpt.write_objects(
                    tmp,
                    staged.objects,
                    strategy,
                    weights=staged.weights,
                    is_writer=writer,
                    process_index=rank,
                    safe_serialization=manifest.get("safe_serialization", True),
                    rng=staged.rng,
                )
                if staged.grads:
                    strategy.checkpoint_io.save_weights(staged.grads, os.path.join(tmp, ckpt.grads_file(rank)))
            except Exception as error:  # what cannot be written at all (wrong content): fails the save too
                failures.record(error if isinstance(error, OSError) else OSError(str(error)))
                written = {}
        failure: BaseException | None = failures.first
        together = key is None and store is not None  # every process of the run is part of this save
        if together:
            background.announce(store, self._done_key(save_id, output_dir, rank), failure)
        if not writer:  # every process of the run saves: the writer publishes, or says why it could not
            background.hear(store, [self._published_key(save_id, output_dir, self._writer_rank())], "save_state")  # type: ignore[attr-defined]
            return
        published = False
        try:
            if together and failure is None:
                ranks = range(self.state.num_processes)
                try:
                    background.hear(store, [self._done_key(save_id, output_dir, r) for r in ranks], "save_state")
                except OSError as error:
                    failure = error
            if failure is None:
                try:  # every process's background writes have ended: the folder is complete
                    manifest.update(written, save_id=save_id, files=record_files(tmp))
                    strategy.checkpoint_io.write_manifest(tmp, manifest)
                    ckpt.publish(tmp, output_dir, strategy.checkpoint_entries())
                    published = True
                except OSError as error:
                    failure = error
            if published:  # total_limit applies once the new folder is in place, before the others hear of it
                self._prune_after(output_dir)
        finally:
            if not published:
                ckpt.discard(tmp)
            if lock is not None:
                lock.release()
            if key is not None and store is not None:
                store.set(
                    key, outcome.published(save_id) if published else outcome.FAILED + (outcome.describe(failure) or "")
                )
            elif together:
                background.announce(store, self._published_key(save_id, output_dir, rank), failure)
        if failure is not None:
            raise failure
        logger.info("saved state to %s (asynchronously)", output_dir)

    def _prune_after(self, output_dir: str) -> None:
        """With automatic naming, remove the oldest checkpoints beyond ``total_limit`` (never ``output_dir``)."""
        config = self.project_configuration
        if config.automatic_checkpoint_naming:
            base = os.path.dirname(os.path.abspath(output_dir))
            for path in ckpt.prune(base, config.total_limit, keep=output_dir):
                logger.info("removed old checkpoint %s (total_limit=%s)", path, config.total_limit)

    def _add_process_files_async(self, output_dir: str) -> str:
        """A process other than the writer of a save into an explicit folder: stage its random states and
        gradients now; once the writer has published the folder, a thread adds them (as the synchronous
        `Checkpointer._add_process_files` does). The pre-hooks run now, on ``output_dir``."""
        from accel_train.checkpoint.staging import stage_objects

        store = self._store_if_distributed()
        key = self._save_key(output_dir)  # type: ignore[attr-defined]
        models = list(self._models)  # type: ignore[attr-defined]
        weights = [self._strategy.checkpoint_weights(model) for model in models]
        for hook in list(self._save_model_state_pre_hook.values()):  # type: ignore[attr-defined]
            hook(models, weights, output_dir)
        staged = stage_objects(
            ckpt.TrainingObjects(),
            weights=[],
            is_writer=False,
            optimizer_state=self._strategy.optimizer_state_dict,
            grads=self._accumulated_gradients(),  # type: ignore[attr-defined]
        )
        io_ = self._strategy.checkpoint_io
        rank = self.state.process_index

        def job() -> None:
            from accel_train.checkpoint.file_io import replace_file

            save_id = outcome.wait_for_writer(store, key)
            os.makedirs(output_dir, exist_ok=True)
            with FolderLock(output_dir), writing_as(save_id):
                replace_file(
                    os.path.join(output_dir, ckpt.rng_file(rank)), lambda tmp: io_.save_rng(tmp, states=staged.rng)
                )
                if staged.grads:
                    grads = staged.grads
                    replace_file(
                        os.path.join(output_dir, ckpt.grads_file(rank)), lambda tmp: io_.save_weights(grads, tmp)
                    )

        return self._start(output_dir, job)

    # -- helpers ----------------------------------------------------------------------------------

    def _start(self, output_dir: str, job: Any) -> str:
        config = self.project_configuration
        if config.automatic_checkpoint_naming:
            self.__dict__["_pending_iteration"] = config.iteration
            config.iteration += 1
        self.__dict__["_pending_save"] = BackgroundSave(output_dir, job).start()
        logger.info("saving state to %s in the background", output_dir)
        return output_dir

    def _side_group(self) -> Any:
        """The gloo group of the background's sharded writes (created by every process at the first
        asynchronous save of a sharded strategy, which every process calls); `None` where none is needed."""
        import torch.distributed as dist

        if self._strategy.name in ("single_device", "ddp") or not (dist.is_available() and dist.is_initialized()):
            return None
        group = self.__dict__.get("_save_side_group")
        if group is None:
            group = self.__dict__["_save_side_group"] = dist.new_group(backend="gloo")
        return group

    def _store_if_distributed(self) -> Any:
        if self.state.num_processes <= 1:
            return None
        from accel_train.components.checkpointer import _default_store

        return _default_store()

    @staticmethod
    def _done_key(save_id: str, output_dir: str, rank: int) -> str:
        return f"accel/async_save/{os.path.abspath(output_dir)}#{save_id}/written/{rank}"

    @staticmethod
    def _published_key(save_id: str, output_dir: str, writer_rank: int) -> str:
        return f"accel/async_save/{os.path.abspath(output_dir)}#{save_id}/published/{writer_rank}"
