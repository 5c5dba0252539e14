"""Paths inside a DCP ``.metadata`` (issue 36, point 2): they are plain strings resolved against the folder.
A pickled path object, a data file named by anything but a string, a name outside the folder or a link out
of it is refused by name before torch's reader opens anything. One process, no training: each case is a
small crafted metadata file beside a small data file."""

from __future__ import annotations

import os
import pathlib
import pickle

import pytest
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta

from accel_state.errors import UnsafeCheckpointError
from accel_train.checkpoint.safety import read_dcp_metadata


class LyingPath:
    """Pickles as a ``PosixPath`` of ``parts`` whose cached string is set to ``shown``."""

    def __init__(self, parts: tuple, shown: str | None = None) -> None:
        self.parts = parts
        self.shown = shown

    def __reduce__(self):
        if self.shown is None:
            return (pathlib.PosixPath, self.parts)
        return (pathlib.PosixPath, self.parts, (None, {"_str": self.shown}))


def _write(folder: pathlib.Path, relative: object, offset: object = 0, length: object = 4, **meta: object) -> str:
    """A DCP folder whose one item lies in ``relative`` (the test's own pickle, written with plain pickle)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "__0_0.distcp").write_bytes(b"data")
    records = meta.pop("records", {MetadataIndex("w"): _StorageInfo(relative, offset, length)})
    metadata = Metadata(state_dict_metadata={}, storage_data=records, **meta)
    path = folder / ".metadata"
    path.write_bytes(pickle.dumps(metadata))
    return str(path)


def test_a_genuine_path_is_read_as_a_plain_string(tmp_path) -> None:
    """torch records the writer's folder as a ``PosixPath``: it is read, as a plain string, not refused."""
    path = _write(tmp_path / "dcp", "__0_0.distcp", storage_meta=StorageMeta(checkpoint_id=pathlib.Path("/w/x")))
    metadata = read_dcp_metadata(path)
    assert type(metadata.storage_meta.checkpoint_id) is str and metadata.storage_meta.checkpoint_id == "/w/x"
    assert type(next(iter(metadata.storage_data.values())).relative_path) is str


@pytest.mark.parametrize(
    ("relative", "found"),
    [
        (LyingPath(("..", "..", "outside", "__0_0.distcp"), "__0_0.distcp"), "pickled state of its own"),
        (LyingPath(("__0_0.distcp",)), "a pickled path object"),
        (LyingPath((b"..", 7)), "a path built from bytes, int instead of strings"),
        (7, "a data file named by a int"),
        ("../outside/__0_0.distcp", "a data file outside its folder"),
        ("/etc/passwd", "a data file outside its folder"),
        ("", "a data file outside its folder"),
    ],
)
def test_a_data_file_named_otherwise_than_by_a_plain_inside_string_is_refused(tmp_path, relative, found) -> None:
    path = _write(tmp_path / "dcp", relative)
    with pytest.raises(UnsafeCheckpointError, match=found) as raised:
        read_dcp_metadata(path)
    assert raised.value.path == path


def test_a_data_file_linked_out_of_the_folder_is_refused(tmp_path) -> None:
    """A link (of the file, or of a folder on its way) that resolves outside is refused, on every read."""
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "stolen.distcp").write_bytes(b"data")
    path = _write(tmp_path / "dcp", "__0_0.distcp")
    read_dcp_metadata(path)  # inside: read
    os.remove(tmp_path / "dcp" / "__0_0.distcp")
    os.symlink(tmp_path / "outside" / "stolen.distcp", tmp_path / "dcp" / "__0_0.distcp")
    with pytest.raises(UnsafeCheckpointError, match="resolves outside its folder") as raised:
        read_dcp_metadata(path)  # the same metadata file, kept from the first read: checked again
    assert str(tmp_path / "outside" / "stolen.distcp") in str(raised.value)
    path = _write(tmp_path / "other", "sub/__0_0.distcp")
    os.symlink(tmp_path / "outside", tmp_path / "other" / "sub")
    with pytest.raises(UnsafeCheckpointError, match="resolves outside its folder"):
        read_dcp_metadata(path)


def test_a_link_that_stays_inside_is_read(tmp_path) -> None:
    path = _write(tmp_path / "dcp", "alias.distcp")
    os.symlink("__0_0.distcp", tmp_path / "dcp" / "alias.distcp")
    assert read_dcp_metadata(path).storage_data


@pytest.mark.parametrize(
    ("records", "found"),
    [
        ([1, 2], "storage records of type list instead of a dict"),
        ({MetadataIndex("w"): "__0_0.distcp"}, "a storage record of type str"),
        ({MetadataIndex("w"): _StorageInfo("__0_0.distcp", -1, 4)}, "whose offset is -1, not a byte count"),
        ({MetadataIndex("w"): _StorageInfo("__0_0.distcp", 0, 2.5)}, "whose length is 2.5, not a byte count"),
    ],
)
def test_storage_records_of_another_shape_are_refused(tmp_path, records, found) -> None:
    path = _write(tmp_path / "dcp", "__0_0.distcp", records=records)
    with pytest.raises(UnsafeCheckpointError, match=found):
        read_dcp_metadata(path)
