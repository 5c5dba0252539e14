"""Telling a damaged ``torch.save`` file from one that asks to run code, without unpickling it.

torch's weights-only reader reports a garbled pickle the way it reports a pickle that names a
forbidden global (both are an ``UnpicklingError``), and a truncated zip as a ``RuntimeError`` of its
zip library. The checks here look at the file's structure only, so that damage is reported as
`CorruptCheckpointError` and only a well-formed file that asks for code as
`UnsafeCheckpointError`:

* the zip: its central directory at the end (gone when the file was cut short), every record's local
  header where the directory says and its bytes inside the file, and the CRC-32 of every record but
  the tensor data (the pickle, the version and byte-order records: small). Tensor bytes are not
  checksummed: that would read every file twice.
* the pickle (`pickle_damage()`): walked opcode by opcode without running anything; a stream that
  ends before its ``STOP`` or holds a byte that is no pickle opcode was damaged, not crafted.
"""

from __future__ import annotations

import io
import os
import pickletools
import re
import struct
import zipfile
import zlib
from typing import Any, BinaryIO

from accel_state.errors import CorruptCheckpointError

__all__ = [
    "check_torch_file_structure",
    "damaged_torch_file",
    "pickle_damage",
    "torch_file_damage",
    "torch_file_id",
]

_LOCAL = struct.Struct("<4s5H3I2H")  # a local file header (30 bytes before its name)
_TENSOR_RECORD = re.compile(r"^[^/]+/data/[^/]+$")  # ``archive/data/0``: tensor bytes, not checksummed
_LEGACY_PICKLES = 5  # torch's format before 1.6: magic number, protocol, system info, object, storage keys

#: What a ``torch.save`` file is expected to be (the ``expected`` part of the error).
TORCH_FILE = "a torch.save file (a zip archive holding a pickle and the tensor bytes)"


def pickle_damage(data: bytes) -> str | None:
    """Why ``data`` is not a well-formed pickle stream (it ends early, or holds a byte that is no pickle
    opcode), or ``None`` when it is one. Nothing is unpickled: the opcodes are only walked.

    A well-formed pickle that names a forbidden global is *not* damaged: that is for the weights-only
    reader to refuse.

    Args:
        data: the pickle bytes (bytes after its ``STOP`` are ignored).
    """
    last = None
    try:
        for opcode, _, _ in pickletools.genops(data):
            last = opcode
    except Exception as error:  # ValueError (unknown opcode, stream exhausted), UnicodeDecodeError ...
        return f"a pickle stream that is broken ({error})"
    if last is None or last.name != "STOP":
        return "a pickle stream that ends before its STOP opcode"
    return None


class _Window(io.RawIOBase):
    """``stream`` read through absolute positions only, with the usual ``seek`` meanings (the file views of
    ``torch.distributed.checkpoint`` count a negative offset from the end the wrong way, and zip readers
    seek from the end)."""

    def __init__(self, stream: BinaryIO) -> None:
        super().__init__()
        stream.seek(0, os.SEEK_END)  # offset 0 from the end: right in every stream
        self.size = stream.tell()
        self._stream = stream
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._position, os.SEEK_END: self.size}[whence]
        self._position = max(0, base + offset)
        return self._position

    def readinto(self, buffer: Any) -> int:
        count = min(len(buffer), self.size - self._position)
        if count <= 0:
            return 0
        self._stream.seek(self._position)
        data = self._stream.read(count)
        buffer[: len(data)] = data
        self._position += len(data)
        return len(data)


def _legacy_damage(stream: BinaryIO) -> tuple[str, str] | None:
    """The damage of a file that is no zip: a plain pickle, or torch's legacy format (a row of pickles, then
    the tensor bytes). Each pickle present must be whole; the file may end after any of them."""
    for _ in range(_LEGACY_PICKLES):
        start = stream.tell()
        if not stream.read(1):
            return None
        stream.seek(start)
        try:
            for _ in pickletools.genops(stream):
                pass
        except Exception as error:
            return TORCH_FILE, f"neither a zip archive nor a well-formed pickle ({error})"
    return None


def torch_file_damage(stream: BinaryIO, walk_pickle: bool = False) -> tuple[str, str] | None:
    """What is wrong with the structure of the ``torch.save`` file in ``stream``, as ``(expected, found)``,
    or ``None`` when its zip is whole and its small records match their CRC-32 (see the module docs).

    Reads the zip's directory, every local header and the small records; not the tensor bytes.

    Args:
        stream: a seekable binary stream of the whole file (read from its start; left anywhere).
        walk_pickle: also walk the pickle's opcodes (`pickle_damage()`): for telling a refused pickle
            from a garbled one once torch's reader failed on it (its CRC may be absent).
    """
    window = _Window(stream)
    return _damage(io.BufferedReader(window), window.size, walk_pickle)


def _damage(stream: BinaryIO, size: int, walk_pickle: bool) -> tuple[str, str] | None:
    if size == 0:
        return TORCH_FILE, "an empty file"
    head = stream.read(4)
    stream.seek(0)
    if head != b"PK\x03\x04":
        return _legacy_damage(stream)
    try:
        archive = zipfile.ZipFile(stream)  # reads the directory; never closes a stream it was given
        infos = archive.infolist()
    except OSError:
        raise
    except Exception as error:  # BadZipFile, struct.error ...: the directory at the end is gone or garbled
        return f"{TORCH_FILE} ending with the zip's directory", f"a file of {size} bytes that does not ({error})"
    if not infos:
        return TORCH_FILE, "a zip archive with no records"
    pickle_name = infos[0].filename.split("/", 1)[0] + "/data.pkl"
    for info in infos:
        stream.seek(info.header_offset)
        header = stream.read(_LOCAL.size)
        if len(header) < _LOCAL.size or header[:4] != b"PK\x03\x04":
            return f"the zip record {info.filename!r} at byte {info.header_offset}", "bytes that are no record header"
        fields = _LOCAL.unpack(header)
        name = stream.read(fields[9])
        if name.decode("utf-8" if info.flag_bits & 0x800 else "cp437", "replace") != info.orig_filename:
            return f"the zip record {info.filename!r} at byte {info.header_offset}", f"a record named {name[:80]!r}"
        start = info.header_offset + _LOCAL.size + fields[9] + fields[10]
        end = start + info.compress_size
        if end > size:
            return f"the zip record {info.filename!r} in bytes {start} to {end}", f"a file of {size} bytes"
        if _TENSOR_RECORD.match(info.filename) or info.compress_type != zipfile.ZIP_STORED:
            continue
        stream.seek(start)
        data = stream.read(info.compress_size)
        if info.CRC and zlib.crc32(data) != info.CRC:  # a CRC of 0: written without one (torch's option)
            return (
                f"the zip record {info.filename!r} with CRC-32 {info.CRC:08x}",
                f"bytes whose CRC-32 is {zlib.crc32(data):08x}",
            )
        if walk_pickle and info.filename == pickle_name:
            found = pickle_damage(data)
            if found is not None:
                return f"a well-formed pickle in {info.filename!r}", found
    if not any(info.filename == pickle_name for info in infos):
        return TORCH_FILE, f"a zip archive without {pickle_name!r}"
    return None


def check_torch_file_structure(stream: BinaryIO, path: str) -> None:
    """Raise `CorruptCheckpointError` when the ``torch.save`` file in ``stream``
    is damaged (`torch_file_damage()`); reads no tensor bytes.

    Args:
        stream: a seekable binary stream of the whole file.
        path: the file named in the error.
    """
    found = torch_file_damage(stream)
    if found is not None:
        raise CorruptCheckpointError(path, *found)


def damaged_torch_file(path: str, stream: BinaryIO | None = None) -> CorruptCheckpointError | None:
    """The error for ``path`` when torch's reader failed on it and the file is damaged (its pickle walked
    too), else ``None`` (the failure is something else: a refused global, an I/O error ...).

    Args:
        path: the ``torch.save`` file (named in the error; opened when ``stream`` is not given).
        stream: the file's content, when it is not read from ``path`` (an item inside a larger file).
    """
    try:
        if stream is not None:
            found = torch_file_damage(stream, walk_pickle=True)
        else:
            with open(path, "rb") as handle:
                found = torch_file_damage(handle, walk_pickle=True)
    except OSError:
        return None
    return None if found is None else CorruptCheckpointError(path, *found)


def torch_file_id(path: str) -> str | None:
    """An identity of the ``torch.save`` zip at ``path``, read from its central directory only: a digest of
    every record's name, CRC-32 and size. The tensor records' CRC-32 cover their bytes and torch writes a
    per-save ``.data/serialization_id`` record, so a file of another save (even of the same size and
    shapes) has another id. ``None`` when the file is no zip (a legacy pickle, or damaged).

    Args:
        path: the ``torch.save`` file.
    """
    import hashlib

    try:
        with zipfile.ZipFile(path) as archive:
            records = sorted((info.filename, info.CRC, info.file_size) for info in archive.infolist())
    except (zipfile.BadZipFile, OSError, ValueError):
        return None
    digest = hashlib.sha256()
    for name, crc, size in records:
        digest.update(f"{name}\0{crc}\0{size}\n".encode())
    return digest.hexdigest()[:32]
