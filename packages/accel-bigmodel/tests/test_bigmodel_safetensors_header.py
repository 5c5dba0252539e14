"""Crafted safetensors headers (issue 36, point 6): accel's reader refuses what the safetensors library refuses.

Each file is made by the test: a well-formed two-tensor file, then one field of its header changed.
The reader (`read_safetensors_header`, and `check_safetensors_file` built on it) must raise
`CorruptCheckpointError` naming the file and the field, never read the bytes as weights and never
raise a raw ``ValueError``/``TypeError``/``AttributeError``. Where the library is installed, it is
asked too, so each crafted case is one the reference refuses.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
import torch

from accel_bigmodel.tensor_io import (
    MAX_HEADER_BYTES,
    FileHandles,
    check_safetensors_file,
    read_coalesced,
    read_safetensors_header,
)
from accel_state.errors import CheckpointError, CorruptCheckpointError

#: a: 2 float32 (8 bytes), b: 3 int16 (6 bytes), packed from data byte 0.
GOOD: dict[str, Any] = {
    "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
    "b": {"dtype": "I16", "shape": [3], "data_offsets": [8, 14]},
}
DATA = struct.pack("<2f3h", 1.5, -2.0, 7, 8, 9)


def _write(path: Path, header: Any, data: bytes = DATA, length: int | None = None) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return path


def _with(name: str, field: str, value: Any) -> dict[str, Any]:
    header = json.loads(json.dumps(GOOD))
    header[name][field] = value
    return header


def _library_refuses(path: Path) -> None:
    safetensors_torch = pytest.importorskip("safetensors.torch")
    with pytest.raises(Exception):
        safetensors_torch.load_file(str(path))


def test_a_well_formed_file_reads_as_written(tmp_path: Path) -> None:
    path = _write(tmp_path / "good.safetensors", {**GOOD, "__metadata__": {"format": "pt"}})
    locations, metadata = check_safetensors_file(str(path))
    assert metadata == {"format": "pt"}
    a, b = read_coalesced([locations["a"], locations["b"]], FileHandles())
    assert a.tolist() == [1.5, -2.0] and b.tolist() == [7, 8, 9]
    pytest.importorskip("safetensors.torch")
    from safetensors.torch import load_file

    assert torch.equal(load_file(str(path))["a"], a)  # the library reads the same bytes


CASES: dict[str, tuple[Any, str]] = {
    # name: (header, a word the error must name)
    "negative begin": (_with("a", "data_offsets", [-8, 0]), "data_offsets"),
    "negative end": (_with("b", "data_offsets", [8, -6]), "data_offsets"),
    "begin after end": (_with("a", "data_offsets", [8, 0]), "data_offsets"),
    "three offsets": (_with("a", "data_offsets", [0, 8, 14]), "data_offsets"),
    "offsets not a list": (_with("a", "data_offsets", "0-8"), "data_offsets"),
    "fractional offset": (_with("a", "data_offsets", [0, 8.0]), "data_offsets"),
    "boolean offset": (_with("a", "data_offsets", [False, 8]), "data_offsets"),
    "overlapping tensors": (
        {"a": GOOD["a"], "b": {"dtype": "I16", "shape": [3], "data_offsets": [2, 8]}},
        "overlap",
    ),
    "gap between tensors": (
        {"a": GOOD["a"], "b": {"dtype": "I16", "shape": [2], "data_offsets": [10, 14]}},
        "gap",
    ),
    "data not starting at 0": (
        {"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}, "b": GOOD["b"]},
        "start of the data",
    ),
    "size not dtype x shape": (_with("a", "shape", [3]), "bytes for tensor 'a'"),
    "negative shape": (_with("a", "shape", [-1, -2]), "shape"),
    "shape not a list": (_with("a", "shape", 2), "shape"),
    "unknown dtype": (_with("a", "dtype", "F31"), "dtype"),
    "dtype not a string": (_with("a", "dtype", ["F32"]), "dtype"),
    "missing dtype": ({"a": {"shape": [2], "data_offsets": [0, 8]}, "b": GOOD["b"]}, "dtype"),
    "entry not an object": ({"a": [0, 8], "b": GOOD["b"]}, "entry"),
    "metadata not an object": ({**GOOD, "__metadata__": ["format", "pt"]}, "__metadata__"),
    "metadata value not a string": ({**GOOD, "__metadata__": {"step": 3}}, "__metadata__"),
    "header a list": ([GOOD], "JSON object"),
    "header a number": (14, "JSON object"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_malformed_header_is_refused_by_name(tmp_path: Path, case: str) -> None:
    header, word = CASES[case]
    path = _write(tmp_path / "crafted.safetensors", header)
    for reader in (read_safetensors_header, check_safetensors_file):
        with pytest.raises(CorruptCheckpointError) as info:
            reader(str(path))
        error = info.value
        assert isinstance(error, CheckpointError) and isinstance(error, ValueError)
        assert error.path == str(path) and str(path) in str(error)
        assert word in str(error), str(error)
    _library_refuses(path)


def test_offsets_past_the_end_of_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path / "short.safetensors", GOOD, data=DATA[:10])
    with pytest.raises(CorruptCheckpointError, match="tensor 'b' in bytes .* a file of"):
        read_safetensors_header(str(path))
    _library_refuses(path)


def test_a_header_length_larger_than_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path / "long.safetensors", GOOD, length=10_000)
    with pytest.raises(CorruptCheckpointError, match="header of 10000 bytes") as info:
        read_safetensors_header(str(path))
    assert info.value.found.startswith("a file of")
    _library_refuses(path)


def test_a_header_over_the_library_limit(tmp_path: Path) -> None:
    # The announced length fits the (sparse) file but exceeds what the library reads.
    path = tmp_path / "huge.safetensors"
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", MAX_HEADER_BYTES + 1))
        handle.truncate(8 + MAX_HEADER_BYTES + 1)
    with pytest.raises(CorruptCheckpointError, match=f"at most {MAX_HEADER_BYTES} bytes"):
        read_safetensors_header(str(path))


def test_an_unknown_dtype_error_says_what_is_known(tmp_path: Path) -> None:
    path = _write(tmp_path / "dtype.safetensors", _with("b", "dtype", "F4"))
    with pytest.raises(CorruptCheckpointError) as info:
        read_safetensors_header(str(path))
    assert "'F4'" in info.value.found and "F32" in info.value.expected and "tensor 'b'" in info.value.expected


def test_zero_size_tensors_may_share_an_offset(tmp_path: Path) -> None:
    # As the library allows: empty tensors take no bytes, so several may sit at the same place.
    header = {
        **GOOD,
        "e1": {"dtype": "F32", "shape": [0], "data_offsets": [8, 8]},
        "e2": {"dtype": "F16", "shape": [0, 4], "data_offsets": [8, 8]},
    }
    path = _write(tmp_path / "empty.safetensors", header)
    locations, _ = check_safetensors_file(str(path))
    assert locations["e1"].nbytes == 0 and locations["e2"].shape == (0, 4)
