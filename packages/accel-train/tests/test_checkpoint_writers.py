"""One writer at a time per checkpoint folder (issue 36, point 3): the folder lock, and two runs that
save into the same folder at the same moment, again and again (real processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from accel_train.checkpoint.folder_lock import (
    LOCK_TIMEOUT_ENV,
    CheckpointLockedError,
    FolderLock,
    lock_path,
    lock_timeout,
)

# -- the lock ---------------------------------------------------------------------------------------------


def test_a_second_writer_waits_then_is_refused_naming_the_folder_and_the_holder(tmp_path) -> None:
    folder = str(tmp_path / "ckpt")
    with FolderLock(folder):
        assert os.path.exists(lock_path(folder))
        started = time.monotonic()
        with pytest.raises(CheckpointLockedError) as raised:
            FolderLock(folder, timeout=0.3).acquire()
        assert time.monotonic() - started >= 0.3
    error = raised.value
    assert isinstance(error, OSError) and error.filename == lock_path(folder)
    text = str(error)
    assert folder in text and f"pid {os.getpid()}" in text and LOCK_TIMEOUT_ENV in text
    assert not os.path.exists(lock_path(folder))  # released: the lock file goes with it
    with FolderLock(folder, timeout=0):  # and the folder is free again at once
        pass


def test_a_writer_waiting_on_a_released_lock_file_takes_the_new_one(tmp_path) -> None:
    """The holder removes the lock file on release; the writer that was waiting on that file must not
    believe it holds the lock (a third writer would then get in beside it)."""
    folder = str(tmp_path / "ckpt")
    first = FolderLock(folder)
    first.acquire()
    second = FolderLock(folder, timeout=10)
    waiting = threading.Thread(target=second.acquire)
    waiting.start()
    time.sleep(0.2)  # the second writer has opened the file and waits on it
    first.release()
    waiting.join(timeout=10)
    assert second.held
    with pytest.raises(CheckpointLockedError):
        FolderLock(folder, timeout=0.2).acquire()  # the second one really holds the folder
    second.release()


@pytest.mark.parametrize("value", ["soon", "-1", "nan"])
def test_a_wrong_lock_timeout_is_named(value: str) -> None:
    with pytest.raises(ValueError, match=rf"{LOCK_TIMEOUT_ENV}=.*not a number of seconds"):
        lock_timeout({LOCK_TIMEOUT_ENV: value})
    assert lock_timeout({LOCK_TIMEOUT_ENV: "2.5"}) == 2.5
    assert lock_timeout({}) == 600


# -- two runs, one folder -----------------------------------------------------------------------------------

ROUNDS = 20

_WRITER = """
import json, os, sys, time
import torch
from accel_train import Accelerator

who, folder, control, rounds = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])


class Tag:
    def __init__(self):
        self.value = torch.zeros(2)

    def state_dict(self):
        return {"tag": self.value}

    def load_state_dict(self, state):
        self.value = state["tag"]


accelerator = Accelerator(cpu=True)
model = torch.nn.Linear(64, 64)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
tag = Tag()
accelerator.register_for_checkpointing(tag)
model, optimizer = accelerator.prepare(model, optimizer)
for round in range(rounds):
    with torch.no_grad():  # every value of this save names its writer and round
        for p in model.parameters():
            p.fill_(who * 1000 + round)
    model(torch.ones(1, 64)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(who * 1000 + round)
    tag.value = torch.tensor([float(who), float(round)])
    open(os.path.join(control, f"ready_{round}_{who}"), "w").close()
    while not os.path.exists(os.path.join(control, f"go_{round}")):
        time.sleep(0.002)
    try:
        accelerator.save_state(folder)
        outcome = "saved"
    except Exception as error:
        outcome = f"{type(error).__name__}: {error}"
    done = os.path.join(control, f"done_{round}_{who}")
    with open(done + ".tmp", "w") as handle:
        handle.write(outcome)
    os.replace(done + ".tmp", done)  # the test reads it as soon as it exists: whole or not at all
"""


def _wait_for(paths: list[str], writers: list[subprocess.Popen], deadline: float) -> None:
    """Wait until every one of ``paths`` exists; ``paths[i]`` is written by ``writers[i]``, which may exit
    once it has written it (after its last round), but not before."""
    while not all(os.path.exists(p) for p in paths):
        for path, writer in zip(paths, writers, strict=True):
            if writer.poll() is not None and not os.path.exists(path):
                raise AssertionError(f"a writer ended early: {writer.communicate()[1][-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {paths}")
        time.sleep(0.005)


def _whole_checkpoint(folder: str) -> tuple[int, int]:
    """(writer, round) of the checkpoint in ``folder``; fails unless every file is from one save."""
    from accel_train.checkpoint.file_io import load_torch, load_weights

    weights = load_weights(os.path.join(folder, "model.safetensors"))
    values = {float(v) for tensor in weights.values() for v in tensor.unique()}
    assert len(values) == 1, f"weights of several saves in {folder}: {values}"
    tag = load_torch(os.path.join(folder, "custom_checkpoint_0.pkl"))["tag"]
    who, round = int(tag[0]), int(tag[1])
    assert values == {float(who * 1000 + round)}, f"weights of one save, tag of another: {values} vs {(who, round)}"
    momentum = load_torch(os.path.join(folder, "optimizer.bin"))["state"]
    assert momentum, "the optimizer file holds no state"
    with open(os.path.join(folder, "accel_checkpoint.json"), encoding="utf-8") as handle:
        manifest = json.load(handle)
    assert manifest["custom"] == ["custom_checkpoint_0.pkl"]
    return who, round


def test_two_runs_saving_into_one_folder_at_once_leave_one_whole_checkpoint(tmp_path) -> None:
    """Two one-process runs start ``save_state`` into the same folder together, 20 times: both saves
    succeed (the second waits for the first), and the folder always holds one save whole, never a mix."""
    folder, control = str(tmp_path / "ckpt"), tmp_path / "control"
    control.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(who), folder, str(control), str(ROUNDS)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for who in (1, 2)
    ]
    try:
        deadline = time.monotonic() + 300
        seen_writers = set()
        for round in range(ROUNDS):
            _wait_for([str(control / f"ready_{round}_{who}") for who in (1, 2)], writers, deadline)
            (control / f"go_{round}").touch()
            _wait_for([str(control / f"done_{round}_{who}") for who in (1, 2)], writers, deadline)
            outcomes = [(control / f"done_{round}_{who}").read_text() for who in (1, 2)]
            assert outcomes == ["saved", "saved"], outcomes
            who, saved_round = _whole_checkpoint(folder)
            assert saved_round == round  # the last complete save won, whole
            seen_writers.add(who)
            leftovers = sorted(e for e in os.listdir(tmp_path) if e.startswith(".ckpt"))
            assert leftovers == [], leftovers  # no partial folder, no lock file
        for writer in writers:
            assert writer.wait(timeout=60) == 0, writer.communicate()[1][-3000:]
    finally:
        for writer in writers:
            if writer.poll() is None:
                writer.kill()
    assert seen_writers, "no round was checked"
