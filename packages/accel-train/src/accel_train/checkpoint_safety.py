"""Checking checkpoint files before a backend's own reader touches them: nothing in them may run code.

Three formats reach a pickle reader somewhere below accel:

* ``torch.save`` zips (optimizer files, DeepSpeed's ``*_model_states.pt`` / ``*_optim_states.pt``, the
  slices inside a ``torch.distributed.checkpoint`` ``.distcp`` file). :func:`check_torch_file` reads
  their pickle with ``torch.load(weights_only=True)`` onto the ``meta`` device (no tensor bytes are
  read), with an explicit allow-list of the extra classes the backend needs.
* ``torch.distributed.checkpoint``'s ``.metadata``, which torch reads with ``pickle.load``:
  :func:`read_dcp_metadata` reads it with an unpickler that resolves only the classes DCP writes.
* DCP's non-tensor items (``BYTE_IO``: step counters, learning rates ...), which torch's default
  planner reads with ``torch.load(weights_only=False)``: :class:`SafeLoadPlanner` reads them with
  ``weights_only=True``, and :func:`check_dcp_folder` checks every item before anything is loaded, so a
  refused folder leaves the model and optimizer untouched.

A refused file raises :class:`~accel_state.errors.UnsafeCheckpointError` naming the file and
the Python global it asked for; nothing of it was executed.
"""

from __future__ import annotations

import io
import os
import pickle
import re
from collections.abc import Iterable
from typing import Any, BinaryIO

import torch

from accel_state.errors import UnsafeCheckpointError

__all__ = [
    "DCP_METADATA_GLOBALS",
    "SafeFileSystemReader",
    "SafeLoadPlanner",
    "check_dcp_folder",
    "check_torch_file",
    "check_torch_stream",
    "read_dcp_metadata",
    "unsafe_found",
]

#: The classes a ``torch.distributed.checkpoint`` ``.metadata`` pickle may name (``module``, ``name``);
#: torch dtypes (``torch.float32`` ...) are allowed too. Each is a plain data class, an enum, or a
#: constructor of a value (``torch.Size``, a path) that runs no code of the file's choosing.
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
        ("pathlib", "PosixPath"),
        ("pathlib", "PurePosixPath"),
        ("pathlib", "WindowsPath"),
        ("pathlib", "PureWindowsPath"),
        ("collections", "OrderedDict"),
    }
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


def _is_weights_only_error(error: BaseException) -> bool:
    if isinstance(error, pickle.UnpicklingError):
        return True
    text = str(error)
    return "weights_only" in text or "Weights only load failed" in text


#: How much of a refused file is read to name the globals it asks for.
_SCAN_LIMIT = 64 * 1024 * 1024

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
    """
    try:
        with torch.serialization.safe_globals(list(allowed)):
            torch.load(stream, map_location="meta", weights_only=True)
    except Exception as error:
        if _is_weights_only_error(error):
            stream.seek(0)
            raise UnsafeCheckpointError(path, unsafe_found(error, stream.read(_SCAN_LIMIT))) from None
        raise


def check_torch_file(path: str | os.PathLike[str], allowed: Iterable[Any] = ()) -> None:
    """:func:`check_torch_stream` on the file ``path``."""
    path = os.fspath(path)
    with open(path, "rb") as stream:
        check_torch_stream(stream, path, allowed)


def load_torch_bytes(data: BinaryIO, path: str) -> Any:
    """``torch.load(weights_only=True)`` of an in-memory ``torch.save`` (a DCP non-tensor item)."""
    try:
        return torch.load(data, weights_only=True)
    except Exception as error:
        if _is_weights_only_error(error):
            data.seek(0)
            raise UnsafeCheckpointError(path, unsafe_found(error, data.read(_SCAN_LIMIT))) from None
        raise


# -- torch.distributed.checkpoint folders ---------------------------------------------------------------------


class _DcpUnpickler(pickle.Unpickler):
    def __init__(self, stream: BinaryIO, path: str) -> None:
        super().__init__(stream)
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in DCP_METADATA_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise UnsafeCheckpointError(self.path, f"GLOBAL {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafeCheckpointError(self.path, f"persistent id {str(pid)[:80]}")


def read_dcp_metadata(path: str | os.PathLike[str]) -> Any:
    """The ``Metadata`` of a DCP ``.metadata`` file, unpickled with the allow-list above.

    Raises:
        UnsafeCheckpointError: the file names another class, or is not a DCP metadata pickle.
    """
    path = os.fspath(path)
    from torch.distributed.checkpoint.metadata import Metadata

    with open(path, "rb") as stream:
        try:
            metadata = _DcpUnpickler(stream, path).load()
        except UnsafeCheckpointError:
            raise
        except Exception as error:
            raise UnsafeCheckpointError(path, f"not a DCP metadata pickle ({type(error).__name__}: {error})") from None
    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpointError(path, f"a {type(metadata).__name__} instead of DCP Metadata")
    return metadata


def _dcp_reader_class() -> type:
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class _SafeFileSystemReader(FileSystemReader):  # type: ignore[misc]
        """``FileSystemReader`` whose ``.metadata`` goes through :func:`read_dcp_metadata`."""

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


def check_dcp_folder(folder: str | os.PathLike[str]) -> Any:
    """Check a whole DCP folder before loading: its ``.metadata`` and every item of every ``.distcp``
    file it names (tensors read onto ``meta``: only their pickles are read). Returns the ``Metadata``.

    Raises:
        UnsafeCheckpointError: a file holds a pickle outside the allow-list (named, with what it asked for).
        FileNotFoundError: the metadata names a data file that is missing.
        ValueError: an item lies outside its data file (truncated or replaced file).
    """
    from torch.distributed.checkpoint.utils import _create_file_view

    folder = os.fspath(folder)
    metadata = read_dcp_metadata(os.path.join(folder, ".metadata"))
    by_file: dict[str, list[Any]] = {}
    for info in (metadata.storage_data or {}).values():
        relative = os.fspath(info.relative_path)
        if os.path.isabs(relative) or ".." in relative.replace("\\", "/").split("/"):
            raise ValueError(f"{folder}/.metadata names a data file outside its folder: {relative!r}")
        by_file.setdefault(relative, []).append(info)
    for relative, infos in by_file.items():
        path = os.path.join(folder, relative)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{folder}/.metadata names {relative}, which is missing: the folder is incomplete")
        size = os.path.getsize(path)
        with open(path, "rb") as stream:
            for info in infos:
                if getattr(info, "transform_descriptors", None):
                    continue  # compressed items: torch reads them with weights_only=True (checked on load)
                if info.offset + info.length > size:
                    raise ValueError(
                        f"{path} is shorter ({size} bytes) than its metadata says (an item ends at "
                        f"{info.offset + info.length}): the file was truncated or replaced"
                    )
                # A view of the item (seekable, nothing read ahead): only its zip directory and pickle are read.
                check_torch_stream(_create_file_view(stream, info.offset, info.length), path)  # type: ignore[arg-type]
    return metadata


# -- errors while writing ---------------------------------------------------------------------------------------


def _os_error_in(error: BaseException) -> OSError | None:
    """The ``OSError`` behind ``error`` (its cause chain, DCP's per-rank failures), if any."""
    seen: set[int] = set()
    todo: list[BaseException] = [error]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno is not None:
            return current
        todo.extend(e for e in (current.__cause__, current.__context__) if e is not None)
        failures = getattr(current, "failures", None)  # torch.distributed.checkpoint's CheckpointException
        if isinstance(failures, dict):
            for value in failures.values():
                first = value[0] if isinstance(value, tuple) else value
                if isinstance(first, BaseException):
                    todo.append(first)
    return None


def _probe_reason(path: str) -> int | None:
    """Why writing under ``path``'s folder fails, found by looking (free space, file-size limit, access)."""
    import errno

    folder = path if os.path.isdir(path) else os.path.dirname(path) or "."
    while folder and not os.path.isdir(folder):
        folder = os.path.dirname(folder)
    try:
        stats = os.statvfs(folder)
        if stats.f_bavail * stats.f_frsize < 1024 * 1024:
            return errno.ENOSPC
    except OSError:
        pass
    if not os.access(folder, os.W_OK):
        return errno.EACCES
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
        if soft != resource.RLIM_INFINITY:
            return errno.EFBIG
    except (ImportError, ValueError, OSError):
        pass
    return None


def write_error(path: str, error: BaseException) -> OSError:
    """An ``OSError`` naming ``path`` and the operating system's reason (``No space left on device`` ...)
    for a failed write, whatever library raised it (torch.save reports only "unexpected pos")."""
    import errno as errno_module

    found = _os_error_in(error)
    code = found.errno if found is not None else None
    if code is None:
        match = re.search(r"os error (\d+)", str(error))  # safetensors' Rust I/O errors
        code = int(match.group(1)) if match else _probe_reason(path)
    reason = os.strerror(code) if code is not None else f"{type(error).__name__}: {error}"
    result = OSError(code if code is not None else errno_module.EIO, f"could not write checkpoint file ({reason})")
    result.filename = path
    return result
