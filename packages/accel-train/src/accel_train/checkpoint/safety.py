"""Checking checkpoint files before a backend's own reader touches them: nothing in them may run code.

Three formats reach a pickle reader somewhere below accel:

* ``torch.save`` zips (optimizer files, DeepSpeed's ``*_model_states.pt`` / ``*_optim_states.pt``, the
  slices inside a ``torch.distributed.checkpoint`` ``.distcp`` file). `check_torch_file()` reads
  their pickle with ``torch.load(weights_only=True)`` onto the ``meta`` device (no tensor bytes are
  read), with an explicit allow-list of the extra classes the backend needs.
* ``torch.distributed.checkpoint``'s ``.metadata``, which torch reads with ``pickle.load``:
  `read_dcp_metadata()` reads it with an unpickler that resolves only the classes DCP writes.
* DCP's non-tensor items (``BYTE_IO``: step counters, learning rates ...), which torch's default
  planner reads with ``torch.load(weights_only=False)``: `SafeLoadPlanner` reads them with
  ``weights_only=True``, and `dcp_folder_checks()` checks every item before anything is loaded, so a
  refused folder leaves the model and optimizer untouched.

A refused file raises `UnsafeCheckpointError` naming the file and
the Python global it asked for; nothing of it was executed. A damaged file (a zip cut short, a CRC
that differs, a pickle that ends early) raises `CorruptCheckpointError`
instead (`accel_train.checkpoint.integrity`). `run_checks()` shares the checks of a
folder that all processes load out between them (each checks a slice) and gives every process the
same verdict in one collective.
"""

from __future__ import annotations

import functools
import io
import os
import pickle
import re
import struct
import zlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any, BinaryIO

import torch

from accel_state.errors import CorruptCheckpointError, UnsafeCheckpointError

__all__ = [
    "DCP_METADATA_GLOBALS",
    "SafeFileSystemReader",
    "SafeLoadPlanner",
    "dcp_folder_checks",
    "check_torch_file",
    "check_torch_stream",
    "read_dcp_metadata",
    "run_checks",
    "unsafe_found",
]

#: The classes a ``torch.distributed.checkpoint`` ``.metadata`` pickle may name (``module``, ``name``);
#: torch dtypes (``torch.float32`` ...) are allowed too. Each is a plain data class, an enum, or a
#: constructor of a value (``torch.Size``) that runs no code of the file's choosing. pathlib's classes are
#: not among them: torch records the writer's folder as one (``StorageMeta.checkpoint_id``), which is read
#: as a plain string instead (`_PATH_CLASSES`).
DCP_METADATA_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    {
        ("torch.distributed.checkpoint.metadata", "Metadata"),
        ("torch.distributed.checkpoint.metadata", "MetadataIndex"),
        ("torch.distributed.checkpoint.metadata", "StorageMeta"),
        ("torch.distributed.checkpoint.metadata", "TensorProperties"),
        ("torch.distributed.checkpoint.metadata", "TensorStorageMetadata"),
        ("torch.distributed.checkpoint.metadata", "BytesStorageMetadata"),
        ("torch.distributed.checkpoint.metadata", "ChunkStorageMetadata"),
        ("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"),
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch.serialization", "_get_layout"),
        ("torch", "Size"),
        ("collections", "OrderedDict"),
    }
)

#: pathlib's classes, as a ``.metadata`` names them: each is built as a string of its parts
#: (`_path_string()`), never as a path object, so no state pickled with it (a cached string that differs
#: from its parts) can make the path that is checked differ from the path that is opened.
_PATH_CLASSES: frozenset[tuple[str, str]] = frozenset(
    {("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"), ("pathlib", "PureWindowsPath")}
)


def unsafe_found(error: BaseException, data: bytes | None = None) -> str:
    """What a refused pickle asked for: the globals its opcodes name (read without running it) when the
    pickle bytes ``data`` are given, else the reason in torch's ``weights_only`` error."""
    named = _globals_in(data) if data is not None else []
    if named:
        return "GLOBAL " + ", ".join(named[:5])
    text = str(error)
    match = re.search(r"GLOBAL ([\w.]+)", text) or re.search(r"Unsupported global: ([\w. ]+)", text)
    if match:
        return f"GLOBAL {match.group(1).strip()}"
    match = re.search(r"WeightsUnpickler error:\s*(\S[^\n]*)", text)
    if match:
        return match.group(1).strip()[:200]
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(error).__name__)
    return first[:200]


_SAFE_GLOBAL_PREFIXES = ("torch._utils._rebuild", "collections.OrderedDict", "torch.", "builtins.set")


def _globals_in(data: bytes) -> list[str]:
    """``module.name`` of every global a pickle (raw, or the ``data.pkl`` of a torch zip) names, found by
    walking its opcodes (nothing is executed); torch's own tensor-rebuilding globals left out."""
    import pickletools
    import zipfile

    if data[:2] == b"PK":
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as archive:
                member = next((n for n in archive.namelist() if n.endswith("data.pkl")), None)
                if member is None:
                    return []
                data = archive.read(member)
        except (zipfile.BadZipFile, OSError):
            return []
    found: list[str] = []
    strings: list[str] = []
    try:
        for opcode, arg, _ in pickletools.genops(data):
            if opcode.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "BINUNICODE8"):
                strings.append(str(arg))
            elif opcode.name == "GLOBAL":
                found.append(str(arg).replace(" ", "."))
            elif opcode.name == "STACK_GLOBAL" and len(strings) >= 2:
                found.append(f"{strings[-2]}.{strings[-1]}")
    except Exception:  # a truncated or odd pickle: report what was found so far
        pass
    names = [name.replace("__builtin__.", "builtins.", 1) for name in found]  # protocol 2 spells it so
    return [name for name in dict.fromkeys(names) if not name.startswith(_SAFE_GLOBAL_PREFIXES)]


# -- torch.save zips -----------------------------------------------------------------------------------------


def check_torch_stream(stream: BinaryIO, path: str, allowed: Iterable[Any] = ()) -> None:
    """Read the pickle of one ``torch.save`` zip from ``stream`` without running code (tensors stay on
    the ``meta`` device, their bytes unread).

    Args:
        stream: a seekable binary stream positioned at the start of the zip.
        path: the file named in the error.
        allowed: extra classes or functions the unpickler may resolve (a backend's own types).

    Raises:
        UnsafeCheckpointError: the pickle names a global outside torch's weights-only set and ``allowed``.
        CorruptCheckpointError: the file is damaged (zip cut short, a record outside the file, a CRC that
            differs, a broken pickle stream): checked first, from the zip's structure.
    """
    from accel_bigmodel.integrity import check_torch_file_structure
    from accel_train.checkpoint.integrity import torch_load_failure

    check_torch_file_structure(stream, path)
    stream.seek(0)
    try:
        with torch.serialization.safe_globals(list(allowed)):
            torch.load(stream, map_location="meta", weights_only=True)
    except Exception as error:
        failure = torch_load_failure(path, error, stream)
        if failure is error:
            raise
        raise failure from None


def check_torch_file(path: str | os.PathLike[str], allowed: Iterable[Any] = ()) -> None:
    """`check_torch_stream()` on the file ``path``."""
    path = os.fspath(path)
    with open(path, "rb") as stream:
        check_torch_stream(stream, path, allowed)


def load_torch_bytes(data: BinaryIO, path: str) -> Any:
    """``torch.load(weights_only=True)`` of an in-memory ``torch.save`` (a DCP non-tensor item)."""
    from accel_train.checkpoint.integrity import torch_load_failure

    try:
        return torch.load(data, weights_only=True)
    except Exception as error:
        failure = torch_load_failure(path, error, data)
        if failure is error:
            raise
        raise failure from None


# -- torch.distributed.checkpoint folders ---------------------------------------------------------------------


class _Refused(Exception):
    """Something in a ``.metadata`` pickle that is refused while it is read (re-raised naming the file)."""


class _PathString(str):
    """A path pickled in a ``.metadata``, as the string of its parts; no state may be set on it afterwards."""

    __slots__ = ()

    def __setstate__(self, state: Any) -> None:
        raise _Refused(f"a path object {str(self)!r} with pickled state of its own (a string other than its parts)")


def _path_string(windows: bool, *parts: Any) -> _PathString:
    """The string of the path made of ``parts`` (a pathlib class's pickled arguments)."""
    import pathlib

    if not all(type(part) is str for part in parts):
        raise _Refused(f"a path built from {', '.join(type(part).__name__ for part in parts)} instead of strings")
    pure = pathlib.PureWindowsPath if windows else pathlib.PurePosixPath
    return _PathString(str(pure(*parts)))


class _DcpUnpickler(pickle.Unpickler):
    def __init__(self, stream: BinaryIO, path: str) -> None:
        super().__init__(stream)
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in DCP_METADATA_GLOBALS:
            return super().find_class(module, name)
        if (module, name) in _PATH_CLASSES:
            return functools.partial(_path_string, "Windows" in name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise UnsafeCheckpointError(self.path, f"GLOBAL {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafeCheckpointError(self.path, f"persistent id {str(pid)[:80]}")


#: The last metadata read, by path: ``(file identity, Metadata)``. A load reads each ``.metadata`` three
#: times (the checks, the shape check, torch's reader); the file is unpickled once while it stays the same.
_METADATA_READ: dict[str, tuple[tuple[int, ...], Any]] = {}


def read_dcp_metadata(path: str | os.PathLike[str]) -> Any:
    """The ``Metadata`` of a DCP ``.metadata`` file, unpickled with the allow-list above.

    The result is kept while the file stays the same (same inode, size and modification time): a
    second read of an unchanged file returns the same object without reading it again.

    Paths in it are strings, never path objects: a pathlib class it names is built as the string of its
    parts, and every data file must be named by a plain string that resolves inside the file's folder
    (symbolic links followed), checked on every read.

    Args:
        path: the ``.metadata`` file.

    Raises:
        UnsafeCheckpointError: the file names another class, is not a DCP metadata pickle, names a data
            file by anything but a plain string, or names one outside its folder.
        CorruptCheckpointError: the file is not a well-formed pickle (cut short, garbled).
    """
    path = os.fspath(path)
    stat = os.stat(path)
    identity = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
    kept = _METADATA_READ.get(path)
    if kept is not None and kept[0] == identity:
        metadata = kept[1]
    else:
        metadata = _read_dcp_metadata(path)
        if len(_METADATA_READ) >= 16:
            _METADATA_READ.pop(next(iter(_METADATA_READ)))
        _METADATA_READ[path] = (identity, metadata)
    _confine(metadata, path)  # every read: a data file may have become a link since the last one
    return metadata


def _confine(metadata: Any, path: str) -> None:
    """Refuse a data file of ``metadata`` (read from ``path``) that lies outside the metadata's folder: an
    absolute path, a ``..`` part, or a symbolic link (of the file or of a folder on its way) that resolves
    outside. torch's reader joins each name to the folder, so the name checked is the name opened."""
    folder = os.path.dirname(path)
    root = os.path.realpath(folder)
    for relative in sorted({info.relative_path for info in (metadata.storage_data or {}).values()}):
        parts = relative.replace("\\", "/").split("/")
        if not relative or "\x00" in relative or os.path.isabs(relative) or ".." in parts:
            raise UnsafeCheckpointError(path, f"a data file outside its folder: {relative!r}")
        resolved = os.path.realpath(os.path.join(folder, relative))
        if os.path.commonpath([root, resolved]) != root:
            raise UnsafeCheckpointError(
                path,
                f"a data file {relative!r} that resolves outside its folder, to {resolved!r}",
                "A symbolic link in a checkpoint may point only inside it; copy the file in instead.",
            )


def _read_dcp_metadata(path: str) -> Any:
    from torch.distributed.checkpoint.metadata import Metadata

    from accel_bigmodel.integrity import pickle_damage

    with open(path, "rb") as stream:
        try:
            metadata = _DcpUnpickler(stream, path).load()
        except UnsafeCheckpointError:
            raise
        except _Refused as refused:
            raise UnsafeCheckpointError(path, str(refused)) from None
        except Exception as error:
            stream.seek(0)
            damage = pickle_damage(stream.read())
            if damage is not None:
                raise CorruptCheckpointError(path, "DCP metadata as a well-formed pickle", damage) from None
            raise UnsafeCheckpointError(path, f"not a DCP metadata pickle ({type(error).__name__}: {error})") from None
    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpointError(path, f"a {type(metadata).__name__} instead of DCP Metadata")
    _check_records(metadata, path)
    _check_tensor_sizes(metadata, path)
    return metadata


def _count(values: Any) -> int | None:
    """The product of ``values`` when each is a plain non-negative int, else ``None``."""
    total = 1
    for value in values:
        if type(value) is not int or value < 0:
            return None
        total *= value
    return total


def _check_tensor_sizes(metadata: Any, path: str) -> None:
    """Refuse a tensor whose declared size its data files cannot hold, before a reader allocates it (a
    merge makes an empty tensor of every declared size): each chunk must lie inside the tensor, be stored in
    a record at least as long as its bytes (compressed records excepted), and the chunks must add up to the
    tensor's elements. A ``.metadata`` declaring a 2**62-element tensor names it here, with its size."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    records = {(index.fqn, tuple(index.offset or ())): info for index, info in (metadata.storage_data or {}).items()}
    for name, entry in (metadata.state_dict_metadata or {}).items():
        if not isinstance(entry, TensorStorageMetadata):
            continue
        size = tuple(entry.size)
        elements = _count(size)
        dtype = getattr(entry.properties, "dtype", None)
        if elements is None or not isinstance(dtype, torch.dtype):
            raise CorruptCheckpointError(path, f"tensor {name!r} with a size of plain counts", f"size {size}")
        item = torch.empty((), dtype=dtype).element_size()
        stored = 0
        for chunk in entry.chunks or ():
            offsets, sizes = tuple(chunk.offsets), tuple(chunk.sizes)
            count = _count(sizes)
            if (
                count is None
                or _count(offsets) is None
                or len(offsets) != len(size)
                or len(sizes) != len(size)
                or any(o + n > s for o, n, s in zip(offsets, sizes, size))
            ):
                raise CorruptCheckpointError(
                    path, f"chunks of tensor {name!r} inside its size {size}", f"offsets {offsets}, sizes {sizes}"
                )
            record = records.get((name, offsets))
            compressed = record is not None and getattr(record, "transform_descriptors", None)
            if record is not None and not compressed and count * item > record.length:
                raise CorruptCheckpointError(
                    path,
                    f"tensor {name!r} of size {size} ({elements} elements of {dtype}) stored in its data file",
                    f"a record of {record.length} bytes for a chunk of {count * item} bytes",
                )
            stored += count
        if stored < elements:
            raise CorruptCheckpointError(
                path,
                f"tensor {name!r} of size {size} ({elements} elements of {dtype}) stored in its data file",
                f"chunks holding {stored} elements",
            )


def _check_records(metadata: Any, path: str) -> None:
    """Refuse storage records of another shape than torch writes: each data file named by a plain string (a
    path object's string may differ from the path it opens), offsets and lengths plain non-negative ints.
    The writer's folder (``storage_meta.checkpoint_id``, a path when torch wrote it) becomes a plain string."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    storage_meta = getattr(metadata, "storage_meta", None)
    if storage_meta is not None and isinstance(getattr(storage_meta, "checkpoint_id", None), str):
        storage_meta.checkpoint_id = str(storage_meta.checkpoint_id)
    records = metadata.storage_data
    if records is None:  # torch's writer always records where each item is; its reader asserts on None
        raise CorruptCheckpointError(path, "DCP metadata with the storage records torch writes", "none")
    if not isinstance(records, dict):
        raise UnsafeCheckpointError(path, f"storage records of type {type(records).__name__} instead of a dict")
    for info in records.values():
        if not isinstance(info, _StorageInfo):
            raise UnsafeCheckpointError(path, f"a storage record of type {type(info).__name__}")
        if type(info.relative_path) is not str:
            shown = str(info.relative_path)[:120] if isinstance(info.relative_path, str) else ""
            raise UnsafeCheckpointError(
                path,
                f"a data file named by a {type(info.relative_path).__name__} {shown!r} instead of a plain string"
                + (" (a pickled path object)" if isinstance(info.relative_path, _PathString) else ""),
            )
        for field in ("offset", "length"):
            value = getattr(info, field)
            if type(value) is not int or value < 0:
                raise UnsafeCheckpointError(path, f"a storage record whose {field} is {value!r}, not a byte count")


def _dcp_reader_class() -> type:
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class _SafeFileSystemReader(FileSystemReader):  # type: ignore[misc]
        """``FileSystemReader`` whose ``.metadata`` goes through `read_dcp_metadata()`."""

        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            path = self._get_metadata_path(kwargs.get("rank"))
            metadata = read_dcp_metadata(os.fspath(path))
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return _SafeFileSystemReader


def SafeFileSystemReader(path: str | os.PathLike[str]) -> Any:
    """A ``torch.distributed.checkpoint.FileSystemReader`` of ``path`` that never unpickles code."""
    return _dcp_reader_class()(path)


def _planner_class(base: type) -> type:
    class _Safe(base):  # type: ignore[misc,valid-type]
        """The same planner, reading non-tensor items with ``weights_only=True``."""

        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            loaded = load_torch_bytes(value, f"DCP item {read_item.dest_index.fqn}")
            if getattr(self, "flatten_state_dict", False):
                from torch.distributed.checkpoint._traverse import set_element as set_nested

                set_nested(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
            else:
                self.state_dict[read_item.dest_index.fqn] = loaded

    _Safe.__name__ = f"Safe{base.__name__}"
    return _Safe


def SafeLoadPlanner(**kwargs: Any) -> Any:
    """``DefaultLoadPlanner(**kwargs)`` whose non-tensor items are read with ``weights_only=True``."""
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    return _planner_class(DefaultLoadPlanner)(**kwargs)


def safe_empty_planner() -> Any:
    """torch's planner that loads a whole DCP folder into an empty dict, reading items safely."""
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner

    return _planner_class(_EmptyStateDictLoadPlanner)()


#: A check of one part of a checkpoint: ``(label, check)``; ``check()`` raises when the part is refused. The
#: label names the part (a relative path, with the byte range of a DCP item) the same way on every process.
Check = tuple[str, Callable[[], None]]


def _meta_storages() -> Callable[[Any], Any]:
    """A ``persistent_load`` for torch's pickles that gives every storage on the ``meta`` device (as
    ``torch.load(map_location="meta")`` does): the pickle is judged, no tensor byte is read."""
    loaded: dict[Any, Any] = {}

    def persistent_load(saved_id: Any) -> Any:
        if not isinstance(saved_id, tuple) or len(saved_id) != 5:
            raise ValueError(f"not a torch storage reference: {str(saved_id)[:80]}")
        typename, storage_type, key, _, numel = saved_id
        if (typename.decode("ascii") if isinstance(typename, bytes) else typename) != "storage":
            raise ValueError(f"not a torch storage reference: {str(saved_id)[:80]}")
        if key not in loaded:
            dtype = torch.uint8 if storage_type is torch.UntypedStorage else storage_type.dtype
            untyped = torch.UntypedStorage(int(numel) * torch._utils._element_size(dtype), device="meta")
            loaded[key] = torch.storage.TypedStorage(wrap_storage=untyped, dtype=dtype, _internal=True)
        return loaded[key]

    return persistent_load


def _check_pickle(pickled: bytes, path: str) -> bool:
    """Judge the ``data.pkl`` of a ``torch.save`` zip with torch's own weights-only unpickler (the one
    ``torch.load(weights_only=True)`` runs), its storages on ``meta``; ``False`` when this torch has no
    such unpickler (the caller then runs ``torch.load`` itself)."""
    try:
        from torch import _weights_only_unpickler as restricted
    except ImportError:
        return False
    unpickler = restricted.Unpickler(io.BytesIO(pickled), encoding="utf-8")
    unpickler.persistent_load = _meta_storages()  # type: ignore[method-assign]
    try:
        unpickler.load()
    except Exception as error:
        from accel_train.checkpoint.integrity import torch_load_failure

        failure = torch_load_failure(path, error, pickled=pickled)
        if failure is error:
            raise
        raise failure from None
    return True


_EOCD = struct.Struct("<4s4H2IH")  # end of central directory: signature, disks, entries, size, offset, comment
_ZIP64_LOCATOR = struct.Struct("<4sIQI")  # signature, disk, offset of the zip64 end record, disks
_ZIP64_EOCD = struct.Struct("<4sQ2H2I4Q")  # signature, size, versions, disks, entries, central directory size, offset
_CENTRAL = struct.Struct("<4s6H3I5H2I")  # a central directory entry (46 bytes before its name)
_LOCAL = struct.Struct("<4s5H3I2H")  # a local file header (30 bytes before its name)
_TAIL = 4096  # bytes read from an item's end: torch's central directory (7 entries) fits easily


def _zip_pickle(fd: int, offset: int, length: int) -> bytes | None:
    """The ``data.pkl`` record of the ``torch.save`` zip at ``offset`` (``length`` bytes) of the open file
    ``fd``, found as torch's zip reader (miniz) finds it: end record at the very end (its zip64 record
    when present), the first entry's folder as the archive name, the one entry named ``<archive>/data.pkl``
    (compared ignoring ASCII case), its stored bytes after the local header, CRC-32 checked.

    ``None`` when anything differs from a plain stored zip as ``torch.save`` writes it (the caller then
    asks torch's own reader): two or three small reads instead of torch's reader over a Python file.
    """
    size = min(length, _TAIL)
    base = length - size  # where the tail starts, relative to the item
    tail = os.pread(fd, size, offset + base)
    if len(tail) != size or size < _EOCD.size:
        return None
    signature, disk, cd_disk, _, entries, cd_size, cd_offset, comment = _EOCD.unpack_from(tail, size - _EOCD.size)
    if signature != b"PK\x05\x06" or comment or disk or cd_disk:
        return None
    locator = size - _EOCD.size - _ZIP64_LOCATOR.size
    if locator >= 0 and tail[locator : locator + 4] == b"PK\x06\x07":
        _, _, record, disks = _ZIP64_LOCATOR.unpack_from(tail, locator)
        position = record - base
        if disks != 1 or not 0 <= position <= locator - _ZIP64_EOCD.size:
            return None
        fields = _ZIP64_EOCD.unpack_from(tail, position)
        if fields[0] == b"PK\x06\x06":
            if fields[4] or fields[5] or fields[1] < _ZIP64_EOCD.size - 12:
                return None
            entries, cd_size, cd_offset = fields[7], fields[8], fields[9]
    start = cd_offset - base
    if start < 0 or start + cd_size > size or entries == 0:
        return None
    names: list[bytes] = []
    records: list[tuple[int, int, int]] = []  # crc, size, local header offset
    position = start
    for _ in range(entries):
        if position + _CENTRAL.size > start + cd_size:
            return None
        field = _CENTRAL.unpack_from(tail, position)
        method, crc, compressed, plain, name_len = field[4], field[7], field[8], field[9], field[10]
        if field[0] != b"PK\x01\x02" or method != 0 or compressed != plain or field[13]:
            return None
        if 0xFFFFFFFF in (compressed, plain, field[16]) or field[16] + _LOCAL.size + compressed > length:
            return None
        end = position + _CENTRAL.size + name_len + field[11] + field[12]
        if end > start + cd_size:
            return None
        names.append(tail[position + _CENTRAL.size : position + _CENTRAL.size + name_len])
        records.append((crc, compressed, field[16]))
        position = end
    slash = names[0].find(b"/")
    if slash < 0:
        return None
    wanted = names[0][: slash + 1].lower() + b"data.pkl"
    found = [index for index, name in enumerate(names) if name.lower() == wanted]
    if len(found) != 1:
        return None
    crc, record_size, local = records[found[0]]
    header = os.pread(fd, _LOCAL.size, offset + local)
    if len(header) != _LOCAL.size:
        return None
    field = _LOCAL.unpack(header)
    if field[0] != b"PK\x03\x04":
        return None
    data_start = local + _LOCAL.size + field[9] + field[10]
    if data_start + record_size > length:
        return None
    data = os.pread(fd, record_size, offset + data_start)
    if len(data) != record_size or zlib.crc32(data) != crc:
        return None
    return data


def _check_dcp_item(path: str, offset: int, length: int, verified: set[bytes]) -> None:
    """Check one item of a ``.distcp`` file (a ``torch.save`` zip at ``offset``), its tensors onto ``meta``.

    The item's pickle (``data.pkl``) is found as torch's zip reader finds it (`_zip_pickle()`, or
    torch's reader itself for an unusual zip) and judged by torch's weights-only unpickler. An item
    whose pickle is byte for byte one already judged gets the same verdict without unpickling it
    again: the exp_avg and exp_avg_sq shards of a parameter share the weight's pickle.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        pickled = _zip_pickle(fd, offset, length)
    finally:
        os.close(fd)
    if pickled is not None and pickled in verified:
        return
    if pickled is not None and _check_pickle(pickled, path):
        verified.add(pickled)
        return
    from torch.distributed.checkpoint.utils import _create_file_view

    with open(path, "rb") as stream:  # an unusual zip, or no weights-only unpickler: torch reads it all
        view = _create_file_view(stream, offset, length)
        check_torch_stream(view, path)  # type: ignore[arg-type]


def dcp_folder_checks(folder: str | os.PathLike[str], verified: set[bytes] | None = None) -> list[Check]:
    """Read and check the ``.metadata`` of a DCP folder, and return one check per item of its data files.

    Reading the metadata (every process does it: it is small) already refuses a class outside the
    allow-list, a data file outside the folder, a missing data file and one shorter than the items it
    should hold. Each returned check reads one item's pickle with ``weights_only=True`` (its tensors onto
    ``meta``, their bytes unread); the checks can be shared out between processes
    (`run_checks()`).

    Args:
        folder: the DCP folder (``pytorch_model_fsdp_0/``, ``optimizer_0/`` ...).
        verified: the item pickles already checked (shared by the checks of several folders: a model's and
            its optimizer's items share pickles); a new set when not given. Checks add to it.

    Raises:
        UnsafeCheckpointError: the metadata names a class outside the allow-list, or a data file outside
            the folder.
        FileNotFoundError: the metadata names a data file that is missing.
        CorruptCheckpointError: a data file is shorter than its items.
    """
    return _dcp_checks(os.fspath(folder), set() if verified is None else verified)[1]


def _dcp_checks(folder: str, verified: set[bytes]) -> tuple[Any, list[Check]]:
    metadata = read_dcp_metadata(os.path.join(folder, ".metadata"))
    by_file: dict[str, list[Any]] = {}
    for info in (metadata.storage_data or {}).values():  # plain strings inside the folder (read_dcp_metadata)
        by_file.setdefault(info.relative_path, []).append(info)
    checks: list[Check] = []
    for relative in sorted(by_file):
        path = os.path.join(folder, relative)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{folder}/.metadata names {relative}, which is missing: the folder is incomplete")
        size = os.path.getsize(path)
        for info in sorted(by_file[relative], key=lambda item: (item.offset, item.length)):
            if info.offset + info.length > size:
                raise CorruptCheckpointError(
                    path,
                    f"an item ending at byte {info.offset + info.length}, as {folder}/.metadata records",
                    f"a file of {size} bytes (cut short, or replaced)",
                )
            if getattr(info, "transform_descriptors", None):
                continue  # compressed items: torch reads them with weights_only=True (checked on load)
            label = f"{relative}@{info.offset}+{info.length}"
            checks.append((label, functools.partial(_check_dcp_item, path, info.offset, info.length, verified)))
    return metadata, checks


# -- checks shared out between processes -------------------------------------------------------------------


def _process_group() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _portable(error: BaseException) -> BaseException:
    """``error`` itself when it survives pickling (to travel to the other processes), else a ``RuntimeError``
    with its type and message."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")


def run_checks(plan: Callable[[], Sequence[Check]], distributed: bool = False) -> None:
    """Run the checks ``plan()`` returns; with ``distributed`` (and a process group of more than one
    process) each process runs only its share, and every process raises the same error.

    Collective when ``distributed``: every process of the default group calls it on the same folder. Each
    runs one contiguous slice of the checks (process ``r`` of ``n`` the ``r``-th ``n``-th: neighbouring
    items of one file, which often share a pickle, stay together) and the processes exchange, in one
    ``all_gather_object``, a digest of their plan and their first failure; all then raise the failure that
    comes first in the plan (the process that found it raises its own exception, the others a copy), so
    no process goes on to load while another refuses. When the plans differ (the processes do not see
    the same files: a folder copied per machine), each process runs every check itself and the
    failures are exchanged once more.

    Args:
        plan: returns the checks, in the same order on every process (it may raise: a refused
            ``.metadata``, a missing file; that failure comes before any check's).
        distributed: share the checks out between the processes (every process must call this).

    Raises:
        UnsafeCheckpointError: a checked file would run code (the first refused, in plan order).
        CorruptCheckpointError: a checked file is damaged.
        FileNotFoundError: a file the checkpoint needs is missing.
        ValueError: a file is truncated or points outside its folder.
    """
    rank, world = _process_group() if distributed else (0, 1)
    failure: tuple[int, BaseException] | None = None
    checks: Sequence[Check] = []
    try:
        checks = plan()
    except Exception as error:
        failure = (-1, error)
    if world == 1:
        if failure is not None:
            raise failure[1]
        for _, check in checks:
            check()
        return

    import hashlib

    import torch.distributed as dist

    def run(indices: Iterable[int]) -> tuple[int, BaseException] | None:
        for index in indices:
            try:
                checks[index][1]()
            except Exception as error:
                return index, error
        return None

    start, end = len(checks) * rank // world, len(checks) * (rank + 1) // world
    if failure is None:
        failure = run(range(start, end))
    digest = hashlib.sha256("\n".join(label for label, _ in checks).encode()).hexdigest()
    found: list[Any] = [None] * world
    dist.all_gather_object(found, (digest, _share_failure(failure)))
    if len({entry[0] for entry in found}) > 1:  # not the same files everywhere: check them all here
        if failure is None or failure[0] >= 0:  # the others' checks that come before this one's failure
            limit = len(checks) if failure is None else failure[0]
            failure = run(index for index in range(limit) if not start <= index < end) or failure
        dist.all_gather_object(found, (digest, _share_failure(failure)))
    failures = [(entry[1][0], process, entry[1][1]) for process, entry in enumerate(found) if entry[1] is not None]
    if not failures:
        return
    index, process, first_failure = min(failures, key=lambda item: (item[0], item[1]))
    if failure is not None and failure[0] == index and process == rank:
        raise failure[1]
    raise first_failure


def _share_failure(failure: tuple[int, BaseException] | None) -> tuple[int, BaseException] | None:
    return None if failure is None else (failure[0], _portable(failure[1]))
