"""Asynchronous ``save_state`` (accel's opt-in ``async_save``): staged at the call, written in the background.

Each case runs on one device (in this process) and on DDP (2 gloo processes of the session pool), in both
DDP save modes of the backend table: an explicit folder (the main process writes alone) and automatic
naming (every process in step). The background write is held on an event the test controls, never timed:
while it is held, training steps run and the folder is not published; once released, the folder holds the
state of the call, and resuming from it is exact.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from cpu_backends import BACKENDS_BY_NAME

from accel_state.testing import reset_shared_state

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def pool(pools):
    """The session's pool of two processes (``pools(2)``, shared with the other multi-rank tests)."""
    return pools(2)


def _in_both(run_here: Callable[..., Any], pool: Any, *args: Any, one_device: bool = True) -> list[tuple[str, Any]]:
    """``run_here(*args)`` in this process (one device) and on each of 2 processes, labelled."""
    one = [("one device", run_here(*args[:-1], os.path.join(args[-1], "one")))] if one_device else []
    two = pool.run(run_here, *args[:-1], os.path.join(args[-1], "two"), timeout=120)
    return one + [(f"rank {rank} of 2", result) for rank, result in enumerate(two)]


@contextmanager
def _held_writes(accelerator: Any) -> Iterator[threading.Event]:
    """Hold this process's model writes (the first files a save writes: weights, or a sharded strategy's
    DCP folder) until the event is set."""
    io_ = accelerator._strategy.checkpoint_io
    gate = threading.Event()

    def holding(original: Callable[..., None]) -> Callable[..., None]:
        def held(*args: Any, **kwargs: Any) -> None:
            if not gate.wait(60):
                raise TimeoutError("the test never released the background write")
            original(*args, **kwargs)

        return held

    io_.save_weights, io_.save_sharded = holding(io_.save_weights), holding(io_.save_sharded)
    try:
        yield gate
    finally:
        gate.set()
        del io_.save_weights, io_.save_sharded


def _not_written(folder: str) -> bool:
    return not os.path.isdir(folder)


# -- the state of the call, training during the write, an exact resume ----------------------------


def rank_async_resume(backend: str, base: str) -> dict[str, Any]:
    reset_shared_state()
    spec = BACKENDS_BY_NAME[backend]
    accelerator = spec.accelerator(base)
    model, optimizer = spec.prepare(accelerator)
    automatic = accelerator.project_configuration.automatic_checkpoint_naming
    spec.step(accelerator, model, optimizer, 0)
    # an earlier save: the next one copies into its memory (reused once it is written), which must not show
    accelerator.save_state(None if automatic else os.path.join(base, "earlier"), async_save=True)
    accelerator.wait_for_checkpoint()  # before the writes are held below
    spec.step(accelerator, model, optimizer, 1)
    at_call = spec.state(accelerator, model)
    explicit = None if automatic else os.path.join(base, "ckpt")
    with _held_writes(accelerator) as gate:
        folder = accelerator.save_state(explicit, async_save=True)
        drawn = torch.rand(4)  # the random states after the call are the saved ones
        steps_while_held = 0
        for index in (2, 3):  # optimizer steps change parameters and moments in place
            spec.step(accelerator, model, optimizer, index)
            steps_while_held += 1
        held = accelerator._pending_save is not None and not accelerator._pending_save.done()
        unpublished = _not_written(folder)
        gate.set()
        published = accelerator.wait_for_checkpoint()
    straight = spec.state(accelerator, model)
    accelerator.load_state(published)
    loaded = spec.state(accelerator, model)
    redrawn = torch.rand(4)
    for index in (2, 3):
        spec.step(accelerator, model, optimizer, index)
    resumed = spec.state(accelerator, model)
    visible = sorted(entry for entry in os.listdir(os.path.dirname(folder)) if not entry.startswith("."))
    reset_shared_state()
    return {
        "returned": folder == published,
        "steps_while_held": steps_while_held,
        "held": held,
        "unpublished": unpublished,
        "moved": any(not torch.equal(straight[k], at_call[k]) for k in straight),
        "loaded": sorted(k for k in at_call if not torch.equal(at_call[k], loaded[k])),
        "rng": torch.equal(drawn, redrawn),
        "differ": sorted(k for k in straight if not torch.equal(straight[k], resumed[k])),
        "visible": visible,
    }


@pytest.mark.parametrize("backend", ["ddp", "ddp_automatic", "fsdp2"])
def test_the_checkpoint_holds_the_state_of_the_call_while_training_goes_on(pool, tmp_path, backend: str) -> None:
    one_device = backend != "fsdp2"  # FSDP2 runs on the 2 processes only
    for where, result in _in_both(rank_async_resume, pool, backend, str(tmp_path), one_device=one_device):
        assert result["returned"], f"{where}: wait_for_checkpoint() returned another folder than save_state()"
        assert result["steps_while_held"] == 2 and result["held"], f"{where}: training did not run during the write"
        assert result["unpublished"], f"{where}: the folder was visible before its files were written"
        assert result["moved"], f"{where}: the steps after the save changed nothing"
        assert result["loaded"] == [], f"{where}: steps after the call leaked into the checkpoint: {result['loaded']}"
        assert result["rng"], f"{where}: the random states saved are not those of the call"
        assert result["differ"] == [], f"{where}: the resumed run differs in {result['differ']}"
        expected = ["checkpoint_0", "checkpoint_1"] if backend == "ddp_automatic" else ["ckpt", "earlier"]
        assert result["visible"] == expected, f"{where}: {result['visible']}"


# -- back to back, total_limit after the publish, a failed write -----------------------------------


def rank_back_to_back_then_failure(base: str) -> dict[str, Any]:
    reset_shared_state()
    from accel_train import Accelerator, AsyncCheckpointError, ProjectConfiguration
    from accel_train.checkpoint import file_io

    spec = BACKENDS_BY_NAME["ddp"]
    config = ProjectConfiguration(project_dir=base, automatic_checkpoint_naming=True, total_limit=1, async_save=True)
    accelerator = Accelerator(project_config=config)
    model, optimizer = spec.prepare(accelerator)
    spec.step(accelerator, model, optimizer, 0)
    first = accelerator.save_state()
    spec.step(accelerator, model, optimizer, 1)
    at_second = spec.state(accelerator, model)
    second = accelerator.save_state()  # waits for the first, then starts
    published = accelerator.wait_for_checkpoint()
    checkpoints = os.path.join(base, "checkpoints")
    after_two = sorted(os.listdir(checkpoints))

    spec.step(accelerator, model, optimizer, 2)
    original = file_io.save_weights

    def read_only(state_dict: Any, path: str, *args: Any) -> None:  # the file system refuses every write
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)

    file_io.save_weights = read_only
    try:
        third = accelerator.save_state()
        raised: dict[str, Any] = {}
        try:
            accelerator.save_state()  # the next call reports the failed one, and starts nothing
        except AsyncCheckpointError as error:
            raised = {"folder": error.folder, "errno": error.errno, "message": str(error)}
    finally:
        file_io.save_weights = original
    after_failure = sorted(os.listdir(checkpoints))
    iteration = config.iteration
    accelerator.load_state(second)
    loaded = spec.state(accelerator, model)
    again = accelerator.save_state()  # the failed checkpoint's number is free again
    accelerator.wait_for_checkpoint()
    reset_shared_state()
    return {
        "first": os.path.basename(first),
        "second": os.path.basename(second),
        "published": published == second,
        "after_two": after_two,
        "third": third,
        "raised": raised,
        "after_failure": after_failure,
        "iteration": iteration,
        "loaded": sorted(k for k in at_second if not torch.equal(at_second[k], loaded[k])),
        "again": os.path.basename(again),
        "final": sorted(os.listdir(checkpoints)),
    }


def test_saves_back_to_back_and_a_failed_write_named_at_the_next_call(pool, tmp_path) -> None:
    for where, result in _in_both(rank_back_to_back_then_failure, pool, str(tmp_path)):
        assert (result["first"], result["second"]) == ("checkpoint_0", "checkpoint_1"), where
        assert result["published"], where
        assert result["after_two"] == ["checkpoint_1"], f"{where}: total_limit=1 after both saves published"
        raised = result["raised"]
        assert raised, f"{where}: the save after a failed asynchronous save did not raise AsyncCheckpointError"
        assert raised["folder"] == result["third"] and raised["errno"] == errno.EROFS, f"{where}: {raised}"
        assert "checkpoint_2" in raised["message"] and "Read-only file system" in raised["message"], where
        assert result["after_failure"] == ["checkpoint_1"], f"{where}: {result['after_failure']}"
        assert result["iteration"] == 2, f"{where}: the failed checkpoint's number was not given back"
        assert result["loaded"] == [], f"{where}: the previous checkpoint changed: {result['loaded']}"
        assert result["again"] == "checkpoint_2" and result["final"] == ["checkpoint_2"], where


def test_load_state_and_end_training_wait_for_the_save_and_report_its_failure(tmp_path) -> None:
    from accel_train import Accelerator, AsyncCheckpointError
    from accel_train.checkpoint import file_io

    accelerator = Accelerator(cpu=True)
    spec = BACKENDS_BY_NAME["ddp"]
    spec.prepare(accelerator)
    folder = accelerator.save_state(str(tmp_path / "ckpt"), async_save=True)
    accelerator.load_state(folder)  # waits for the save of the folder it loads
    assert accelerator._pending_save is None
    accelerator.save_state(folder, async_save=True)
    accelerator.end_training()
    assert accelerator._pending_save is None and os.path.isfile(os.path.join(folder, "model.safetensors"))

    reset_shared_state()
    accelerator = Accelerator(cpu=True)
    spec.prepare(accelerator)

    def no_space(state_dict: Any, path: str, *args: Any) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

    original, file_io.save_weights = file_io.save_weights, no_space
    try:
        accelerator.save_state(str(tmp_path / "full"), async_save=True)
        with pytest.raises(AsyncCheckpointError, match="full failed: .*No space left on device"):
            accelerator.end_training()
    finally:
        file_io.save_weights = original
    visible = sorted(entry for entry in os.listdir(tmp_path) if not entry.startswith("."))
    assert visible == ["ckpt"], f"the failed save left {visible}"


# -- what is refused, by name -------------------------------------------------------------------


def rank_sharded_refusal(base: str) -> str:
    reset_shared_state()
    spec = BACKENDS_BY_NAME["fsdp1"]
    accelerator = spec.accelerator(base)
    spec.prepare(accelerator)
    try:
        accelerator.save_state(os.path.join(base, "ckpt"), async_save=True)
    except ValueError as error:
        message = str(error)
    else:
        message = "no error"
    leftovers = os.listdir(base)
    reset_shared_state()
    return f"{message} | {leftovers}"


def test_a_backend_that_cannot_stage_refuses_async_save_by_name(pool, tmp_path) -> None:
    start = "save_state(async_save=True) is not supported with the 'fsdp' backend: FSDP saves asynchronously with"
    for rank, message in enumerate(pool.run(rank_sharded_refusal, str(tmp_path), timeout=120)):
        assert message.startswith(start), f"rank {rank}: {message}"
        assert "(this run: fsdp_version=1, SHARDED_STATE_DICT)" in message, f"rank {rank}: {message}"
        assert "supports one device, DDP, and FSDP2" in message and message.endswith("| []"), f"rank {rank}: {message}"


def test_async_save_takes_only_a_bool(tmp_path) -> None:
    from accel_train import Accelerator, ProjectConfiguration

    with pytest.raises(TypeError, match="ProjectConfiguration.async_save must be a bool, got 'yes'"):
        ProjectConfiguration(async_save="yes")  # type: ignore[arg-type]
    accelerator = Accelerator(cpu=True)
    with pytest.raises(TypeError, match="async_save must be True, False or None, got 1"):
        accelerator.save_state(str(tmp_path / "ckpt"), async_save=1)  # type: ignore[arg-type]
    assert accelerator.wait_for_checkpoint() is None  # nothing in flight
    assert not (tmp_path / "ckpt").exists()


def test_an_async_save_writes_the_files_of_a_synchronous_one(tmp_path) -> None:
    from accel_train import Accelerator
    from accel_train.checkpoint.file_io import load_weights

    accelerator = Accelerator(cpu=True)
    spec = BACKENDS_BY_NAME["ddp"]
    model, optimizer = spec.prepare(accelerator)
    spec.step(accelerator, model, optimizer, 0)
    state = torch.get_rng_state()
    sync = accelerator.save_state(str(tmp_path / "sync"))
    torch.set_rng_state(state)
    asynchronous = accelerator.save_state(str(tmp_path / "async"), async_save=True)
    assert accelerator.wait_for_checkpoint() == asynchronous
    assert sorted(os.listdir(sync)) == sorted(os.listdir(asynchronous))
    for name in ("model.safetensors", "random_states_0.safetensors"):
        a, b = load_weights(os.path.join(sync, name)), load_weights(os.path.join(asynchronous, name))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    with (
        open(os.path.join(sync, "accel_checkpoint.json")) as one,
        open(os.path.join(asynchronous, "accel_checkpoint.json")) as two,
    ):
        manifests = json.load(one), json.load(two)
    ids = [manifest.pop("save_id") for manifest in manifests]
    assert ids[0] != ids[1]  # each save its own id; all else the same, the record of the files included
    assert manifests[0] == manifests[1] and "random_states_0.safetensors" in manifests[0]["files"]


# -- a kill during the background write ---------------------------------------------------------


def test_a_kill_during_the_background_write_leaves_the_previous_checkpoint(tmp_path) -> None:
    from accel_train import Accelerator

    result = subprocess.run(
        [sys.executable, os.path.join(HERE, "async_save_child.py"), str(tmp_path), "kill"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == -9, f"the child was not killed during the write: {result.returncode} {result.stderr}"
    assert "written while training" in result.stdout, result.stdout
    visible = sorted(entry for entry in os.listdir(tmp_path) if not entry.startswith("."))
    assert visible == ["ckpt"], f"a partial folder is visible after the kill: {visible}"
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.load_state(str(tmp_path / "ckpt"))
    assert all(bool((p == 1.0).all()) for p in model.parameters()), "the previous checkpoint was not kept"


def test_interpreter_exit_waits_for_the_write(tmp_path) -> None:
    from accel_train.checkpoint.file_io import load_weights

    result = subprocess.run(
        [sys.executable, os.path.join(HERE, "async_save_child.py"), str(tmp_path), "exit"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0 and "returned before the write" in result.stdout, result.stderr
    weights = load_weights(str(tmp_path / "ckpt" / "model.safetensors"))
    assert all(bool((tensor == 3.0).all()) for tensor in weights.values()), "the checkpoint is not the saved state"


def test_a_preemption_save_waits_for_the_save_in_flight_and_is_written_before_exit(tmp_path) -> None:
    import signal

    from accel_train import Accelerator, ProjectConfiguration
    from accel_train.preemption import PREEMPTION_EXIT_CODE

    config = ProjectConfiguration(
        project_dir=str(tmp_path),
        automatic_checkpoint_naming=True,
        continue_numbering_on_load=True,
        save_on_preemption=True,
        async_save=True,
    )
    accelerator = Accelerator(cpu=True, project_config=config)
    spec = BACKENDS_BY_NAME["ddp"]
    model, optimizer = spec.prepare(accelerator)
    try:
        spec.step(accelerator, model, optimizer, 0)
        with _held_writes(accelerator) as gate:
            accelerator.save_state()  # checkpoint_0, held in the background
            os.kill(os.getpid(), signal.SIGTERM)  # the scheduler asks the job to stop
            gate.set()
            with pytest.raises(SystemExit) as stopped:
                accelerator.check_preemption()
        assert stopped.value.code == PREEMPTION_EXIT_CODE
        assert accelerator._pending_save is None, "the preemption save was started in the background"
        for name in ("checkpoint_0", "checkpoint_1"):
            assert os.path.isfile(tmp_path / "checkpoints" / name / "model.safetensors"), name
    finally:
        if accelerator._preemption is not None:
            accelerator._preemption.uninstall()
