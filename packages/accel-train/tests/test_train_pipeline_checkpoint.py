"""Pipeline-parallel checkpoints (``ParallelismConfig(pp_size=2)``).

* The checks ``load_state`` runs first look into the pipeline's folders, and a new save does not carry the
  previous save's pipeline entries along.
"""

from __future__ import annotations

import os
import pickle
from typing import Any

import pytest


class _Exploit:
    """A pickle that writes ``marker`` when it is unpickled by a reader that runs code."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


# -- the folder checks and the swap know the pipeline's entries -------------------------------------


def test_the_folder_checks_look_into_the_entries_of_the_strategy_that_reads(tmp_path) -> None:
    from accel_state.errors import UnsafeCheckpointError
    from accel_train.checkpoint_io import CheckpointIO
    from accel_train.checkpointing import check_folder
    from accel_train.strategies.pipeline.strategy import CHECKPOINT_ENTRIES

    marker = str(tmp_path / "marker")
    (tmp_path / "ckpt" / "optimizer_pp_0").mkdir(parents=True)
    (tmp_path / "ckpt" / "optimizer_pp_0" / ".metadata").write_bytes(pickle.dumps(_Exploit(marker)))
    check_folder(str(tmp_path / "ckpt"), CheckpointIO())  # no strategy entries: a folder of the user's
    with pytest.raises(UnsafeCheckpointError, match=r"optimizer_pp_0/\.metadata.*GLOBAL builtins\.exec"):
        check_folder(str(tmp_path / "ckpt"), CheckpointIO(), entries=CHECKPOINT_ENTRIES)
    assert not os.path.exists(marker)


def test_a_new_save_does_not_carry_the_previous_pipeline_entries_along(tmp_path) -> None:
    from accel_train.checkpointing import publish
    from accel_train.strategies.pipeline.strategy import CHECKPOINT_ENTRIES

    def save(name: str) -> str:
        tmp = tmp_path / f".{name}.partial"
        (tmp / "pytorch_model_pp_0").mkdir(parents=True)
        return str(tmp)

    final = tmp_path / "ckpt"
    for entry in ("pytorch_model_pp_0", "optimizer_pp_1"):
        (final / entry).mkdir(parents=True)
    (final / "notes.txt").write_text("the user's")
    publish(save("first"), str(final), CHECKPOINT_ENTRIES)
    assert sorted(os.listdir(final)) == ["notes.txt", "pytorch_model_pp_0"]  # the user's file stays
    (final / "optimizer_pp_1").mkdir()
    publish(save("second"), str(final))  # without the strategy's entries it is taken for the user's
    assert sorted(os.listdir(final)) == ["notes.txt", "optimizer_pp_1", "pytorch_model_pp_0"]
