"""``accel_state.testing.pickle_record_span``: the damaged-checkpoint tests of accel-bigmodel and
accel-train garble bytes where it says the pickle is, so it must point at exactly the pickle's bytes."""

from __future__ import annotations

import pathlib
import zipfile

import pytest
import torch

from accel_state.testing import pickle_record_span


def test_the_span_holds_exactly_the_pickle_record(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "state.bin"
    torch.save({"weight": torch.arange(6.0), "step": 3}, path)
    start, length = pickle_record_span(path)
    with zipfile.ZipFile(path) as archive:
        record = archive.read(next(n for n in archive.namelist() if n.endswith("/data.pkl")))
    data = path.read_bytes()
    assert data[start : start + length] == record
    assert record[:1] == b"\x80" and record.endswith(b".")  # PROTO first, STOP last


@pytest.mark.parametrize("content", [b"not a zip at all", None])
def test_a_file_without_a_pickle_record_is_named(tmp_path: pathlib.Path, content: bytes | None) -> None:
    path = tmp_path / "other.bin"
    if content is None:
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("archive/readme.txt", "no pickle here")
    else:
        path.write_bytes(content)
    with pytest.raises(ValueError, match=r"other\.bin' is not a torch\.save zip with a data\.pkl record"):
        pickle_record_span(path)
