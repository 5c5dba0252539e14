"""Writing checkpoint files so that a failed or killed write never leaves a damaged file under a real name.

Every file is written under a hidden temporary name in its final folder and renamed (or linked) into
place. An ``OSError`` (disk full, permission denied, file too large) becomes a
`CheckpointWriteError` naming the path and the OS reason, after the partial file is removed.
The safetensors writer is our own (header + raw bytes), so the OS error reaches us unchanged.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from accel_bigmodel.tensor_io import SAFETENSORS_DTYPES, _byte_view

_DTYPE_NAMES = {dtype: name for name, dtype in SAFETENSORS_DTYPES.items()}
TMP_PREFIX = ".accel-tmp-"


class CheckpointWriteError(OSError):
    """A checkpoint file could not be written (the OS reason and the path are in the message).

    The partial file was removed; a previous checkpoint at the same place is intact.
    """


def tmp_name(folder: str, final_name: str, token: str | None = None) -> str:
    """A hidden path in ``folder`` for writing ``final_name`` (recognised by `remove_leftovers()`)."""
    return os.path.join(folder, f"{TMP_PREFIX}{token or uuid.uuid4().hex[:12]}-{final_name}")


def write_error(path: str, err: OSError, what: str = "checkpoint file") -> CheckpointWriteError:
    reason = err.strerror or str(err)
    return CheckpointWriteError(err.errno, f"Cannot write {what} {path!r}: {reason}", path)


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.remove(path)


@contextlib.contextmanager
def writing(path: str, what: str = "checkpoint file") -> Iterator[Any]:
    """Open ``path`` for writing; on any error remove it, turning an ``OSError`` into a named one."""
    try:
        f = open(path, "wb")  # noqa: SIM115  (closed below, also on error)
    except OSError as err:
        raise write_error(path, err, what) from None
    try:
        with f:
            yield f
    except OSError as err:
        _remove_quietly(path)
        raise write_error(path, err, what) from None
    except BaseException:
        _remove_quietly(path)
        raise


def _write_all(f: Any, data: memoryview | bytes) -> None:
    view = memoryview(data)
    while view.nbytes:
        written = f.write(view)
        if not written:
            raise OSError(28, os.strerror(28))
        view = view[written:]


def safetensors_bytes_header(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str]) -> tuple[bytes, int]:
    """The safetensors header (length prefix included, padded to 8 bytes) and the data size."""
    header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for name, tensor in tensors.items():
        if tensor.dtype not in _DTYPE_NAMES:
            raise ValueError(f"Tensor {name!r} has dtype {tensor.dtype}, which safetensors cannot store.")
        nbytes = tensor.numel() * tensor.element_size()
        header[name] = {
            "dtype": _DTYPE_NAMES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-(len(raw) + 8) % 8)
    return len(raw).to_bytes(8, "little") + raw, offset


def write_safetensors(path: str, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str]) -> int:
    """Write ``tensors`` (CPU, contiguous) as a safetensors file at ``path``; returns its size in bytes.

    Raises:
        CheckpointWriteError: the OS refused a write (the partial file is removed).
    """
    prepared = {name: t.detach().to("cpu").contiguous() for name, t in tensors.items()}
    header, size = safetensors_bytes_header(prepared, metadata)
    with writing(path) as f:
        f.write(header)
        for tensor in prepared.values():
            if tensor.numel():
                _write_all(f, _byte_view(tensor))
    return len(header) + size


def write_raw_tensor(path: str, tensor: torch.Tensor, what: str = "offloaded weight") -> int:
    """Write the raw bytes of ``tensor`` (made contiguous, on CPU) to ``path``; returns the size."""
    data = tensor.detach().to("cpu").contiguous()
    with writing(path, what) as f:
        if data.numel():
            _write_all(f, _byte_view(data))
    return data.numel() * data.element_size()


def link_into(folder: str, source: str) -> str:
    """A name inside ``folder`` that holds ``source``'s bytes: a hard link (no copy), else a copy.

    Lets an offload index refer to weights of a checkpoint stored elsewhere while every index entry
    stays inside its folder. Never a symbolic link: readers refuse a link that resolves outside the
    folder (`accel_bigmodel.confine`), so what is written here is what they read back. Returns the name
    (relative to ``folder``).
    """
    import hashlib

    absolute = os.path.abspath(source)
    name = f"linked-{hashlib.sha1(absolute.encode()).hexdigest()[:12]}-{os.path.basename(absolute)}"
    target = os.path.join(folder, name)
    if os.path.exists(target) and os.path.samefile(target, absolute):
        return name
    staged = tmp_name(folder, name)
    try:
        try:
            os.link(absolute, staged)
        except OSError:  # another filesystem (or none with hard links): the bytes are copied
            import shutil

            shutil.copyfile(absolute, staged)
        os.replace(staged, target)
    except OSError as err:
        _remove_quietly(staged)
        raise write_error(target, err, "offload link") from None
    return name


def write_bytes(path: str, data: bytes, what: str = "checkpoint file") -> int:
    """Write ``data`` to ``path`` (a named error and no partial file on failure); returns the size."""
    with writing(path, what) as f:
        _write_all(f, data)
    return len(data)


def write_torch(path: str, obj: Any) -> int:
    """``torch.save(obj)`` to ``path`` through memory, so a full disk gives an OS error, not torch's zip error."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return write_bytes(path, buffer.getbuffer().tobytes())


def replace(src: str, dst: str) -> None:
    """Rename ``src`` over ``dst`` atomically (a named error on failure)."""
    try:
        os.replace(src, dst)
    except OSError as err:
        raise write_error(dst, err) from None


def link_over(src: str, dst: str) -> None:
    """Make ``dst`` hold ``src``'s content atomically while ``src`` stays: a hard link renamed over ``dst``.

    Falls back to a copy where the filesystem has no hard links.
    """
    import shutil

    staged = tmp_name(os.path.dirname(dst), os.path.basename(dst))
    try:
        try:
            os.link(src, staged)
        except OSError:
            shutil.copyfile(src, staged)
        os.replace(staged, dst)
    except OSError as err:
        _remove_quietly(staged)
        raise write_error(dst, err) from None


def remove_leftovers(folder: str, keep: set[str]) -> None:
    """Remove hidden temporary files of earlier interrupted writes in ``folder``, except those in ``keep``."""
    with contextlib.suppress(OSError):
        for name in os.listdir(folder):
            if name.startswith(TMP_PREFIX) and name not in keep:
                _remove_quietly(os.path.join(folder, name))
