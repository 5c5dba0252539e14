"""Raw tensor reads and writes: safetensors headers, byte ranges read straight into tensors.

Reading a weight means one ``preadv`` into a freshly allocated tensor (the GIL is released while the
kernel copies), so background threads can prefetch while the main thread computes. Nothing here
needs numpy.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import struct
from typing import Any, NamedTuple

import torch

from accel_state.errors import CORRUPT_HINT, CheckpointError, CorruptCheckpointError

SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "C64": torch.complex64,
}
for _name, _attr in (
    ("F8_E4M3", "float8_e4m3fn"),
    ("F8_E5M2", "float8_e5m2"),
    ("U16", "uint16"),
    ("U32", "uint32"),
    ("U64", "uint64"),
):
    if hasattr(torch, _attr):
        SAFETENSORS_DTYPES[_name] = getattr(torch, _attr)


class TensorLocation(NamedTuple):
    """Where a tensor's bytes are: ``path`` at byte ``offset``, with its stored dtype and shape.

    A named tuple (immutable, like the frozen record it replaces) because a header makes one per tensor:
    building a tuple costs a fraction of a frozen dataclass's checked attribute writes.
    """

    path: str
    offset: int
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count * _element_size(self.dtype)


_ELEMENT_SIZES: dict[torch.dtype, int] = {}


def _element_size(dtype: torch.dtype) -> int:
    size = _ELEMENT_SIZES.get(dtype)
    if size is None:
        size = _ELEMENT_SIZES[dtype] = torch.empty((), dtype=dtype, device="meta").element_size()
    return size


def read_safetensors_header(path: str) -> tuple[dict[str, TensorLocation], dict[str, str]]:
    """Tensor locations and metadata of a safetensors file, read from its header only.

    The header is checked as the safetensors library checks it before reading a tensor, so a file it
    refuses is refused here too rather than read as wrong weights: a file too short for the header it
    announces (or a header over 100 MB), a header that is not a JSON object, ``__metadata__`` that is
    not an object of strings, an entry without a known ``dtype``, a ``shape`` of non-negative integers
    and ``data_offsets`` of two non-negative integers in order, a size that is not dtype x shape,
    tensors that overlap, leave a gap or start after byte 0 of the data, or bytes past the end of the
    file. Each is a `CorruptCheckpointError` (a `CheckpointError` and a ``ValueError``) naming the file
    and the field. Bytes after the last tensor are left to `check_safetensors_file()`.

    Args:
        path: the safetensors file.
    """
    return _read_header(path)[1:]


#: The largest header the safetensors library reads (its ``HeaderTooLarge`` limit), in bytes.
MAX_HEADER_BYTES = 100_000_000


def _read_header(path: str) -> tuple[int, dict[str, TensorLocation], dict[str, str]]:
    """``(header length, locations, metadata)`` of the safetensors file ``path``, every field checked."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        raw_len = f.read(8)
        if len(raw_len) < 8:
            raise CorruptCheckpointError(
                path, "a safetensors file starting with the 8-byte header length", f"{size} bytes"
            )
        (header_len,) = struct.unpack("<Q", raw_len)
        if header_len > size - 8:
            raise CorruptCheckpointError(
                path,
                f"a safetensors header of {header_len} bytes after its 8-byte length (as the file's first bytes say)",
                f"a file of {size} bytes",
            )
        if header_len > MAX_HEADER_BYTES:
            raise CorruptCheckpointError(
                path, f"a safetensors header of at most {MAX_HEADER_BYTES} bytes", f"one of {header_len} bytes"
            )
        raw = f.read(header_len)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CorruptCheckpointError(path, "a safetensors header in JSON", f"bytes that are not JSON ({err})") from None
    if not isinstance(header, dict):
        raise CorruptCheckpointError(path, "a safetensors header holding a JSON object", f"a {type(header).__name__}")
    metadata = _metadata(path, header.pop("__metadata__", None))
    base = 8 + header_len
    locations: dict[str, TensorLocation] = {}
    spans: list[tuple[int, int, str]] = []
    for name, info in header.items():
        begin, end, location = _entry(path, name, info, base)
        if base + end > size:
            raise CorruptCheckpointError(
                path, f"tensor {name!r} in bytes {base + begin} to {base + end}", f"a file of {size} bytes"
            )
        locations[name] = location
        spans.append((begin, end, name))
    _check_packed(path, spans)
    return header_len, locations, metadata


def _metadata(path: str, value: Any) -> dict[str, str]:
    """The header's ``__metadata__``: absent, null or an object whose values are all strings."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(item, str) for item in value.values()):
        raise CorruptCheckpointError(
            path, "`__metadata__` in the safetensors header as an object of strings", f"{value!r:.200}"
        )
    return value


def _is_count(value: Any) -> bool:
    """A JSON integer of 0 or more (JSON ``true`` is a bool, not a count)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _text(value: Any) -> str | None:
    """``value`` when it is a string (a dict key to look up), else ``None``."""
    return value if type(value) is str else None


def _entry(path: str, name: str, info: Any, base: int) -> tuple[int, int, TensorLocation]:
    """``(begin, end, location)`` of header entry ``name``, each field checked."""
    if type(info) is dict:  # a well-formed entry passes every check below in a few operations
        dtype_name = _text(info.get("dtype"))
        dtype = SAFETENSORS_DTYPES.get(dtype_name) if dtype_name is not None else None
        shape, offsets = info.get("shape"), info.get("data_offsets")
        if dtype is not None and type(shape) is list and type(offsets) is list and len(offsets) == 2:
            begin, end = offsets
            if type(begin) is int and type(end) is int and 0 <= begin <= end:
                count = 1
                for dim in shape:
                    if type(dim) is not int or dim < 0:
                        break
                    count *= dim
                else:
                    if count * _element_size(dtype) == end - begin:
                        return begin, end, TensorLocation(path, base + begin, dtype, tuple(shape))
    # otherwise each field in turn, so that the error names the one that is wrong

    def bad(field: str, expected: str, found: Any) -> CorruptCheckpointError:
        return CorruptCheckpointError(path, f"`{field}` of tensor {name!r} as {expected}", f"{found!r:.200}")

    if not isinstance(info, dict):
        raise bad("entry", "an object with dtype, shape and data_offsets", info)
    dtype_name = info.get("dtype")
    if not isinstance(dtype_name, str) or dtype_name not in SAFETENSORS_DTYPES:
        raise CorruptCheckpointError(
            path,
            f"`dtype` of tensor {name!r} as one of {', '.join(SAFETENSORS_DTYPES)}",
            f"{dtype_name!r:.200}",
            hint="A dtype this torch cannot hold is refused too: convert the file with the library that wrote "
            "it, or use a torch that has the dtype; otherwise " + CORRUPT_HINT[0].lower() + CORRUPT_HINT[1:],
        )
    shape = info.get("shape")
    if not isinstance(shape, list) or not all(_is_count(dim) for dim in shape):
        raise bad("shape", "a list of integers of 0 or more", shape)
    offsets = info.get("data_offsets")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_count(item) for item in offsets):
        raise bad("data_offsets", "two integers of 0 or more (begin, end)", offsets)
    begin, end = offsets
    if end < begin:
        raise bad("data_offsets", "a begin no larger than the end", offsets)
    location = TensorLocation(path, base + begin, SAFETENSORS_DTYPES[dtype_name], tuple(shape))
    if location.nbytes != end - begin:
        raise CorruptCheckpointError(
            path,
            f"{location.nbytes} bytes for tensor {name!r} ({dtype_name}, shape {list(shape)})",
            f"{end - begin} bytes in its `data_offsets` {offsets}",
        )
    return begin, end, location


def _check_packed(path: str, spans: list[tuple[int, int, str]]) -> None:
    """The tensors' byte ranges, in order, follow one another from byte 0 of the data: no overlap, no gap."""
    position = 0
    previous = None
    for begin, end, name in sorted(spans):
        if begin != position:
            where = f"right after tensor {previous!r}" if previous is not None else "at the start of the data"
            found = "an overlap with it" if begin < position else f"a gap of {begin - position} bytes"
            raise CorruptCheckpointError(
                path,
                f"tensor {name!r} at data byte {position}, {where}",
                f"`data_offsets` [{begin}, {end}]: {found}",
            )
        position, previous = end, name


def check_safetensors_file(path: str) -> tuple[dict[str, TensorLocation], dict[str, str]]:
    """The header of a safetensors file, checked to describe the whole file as the safetensors library
    requires before it reads one: tensors packed one after the other from the end of the header, the
    last ending at the end of the file. Reads the header only.

    Args:
        path: the safetensors file.

    Raises:
        CorruptCheckpointError: the file is shorter or longer than its header says, or its header is
            broken (see `read_safetensors_header()`).
    """
    header_len, locations, metadata = _read_header(path)  # tensors packed from the end of the header
    base = 8 + header_len
    position = base + sum(location.nbytes for location in locations.values())
    size = os.path.getsize(path)
    if position != size:
        raise CorruptCheckpointError(
            path,
            f"{position} bytes (a {header_len}-byte header and {position - base} bytes of tensors)",
            f"a file of {size} bytes",
        )
    return locations, metadata


def _byte_view(tensor: torch.Tensor) -> memoryview:
    """A writable memoryview over a contiguous CPU tensor's bytes (no copy, no numpy)."""
    nbytes = tensor.numel() * tensor.element_size()
    return memoryview((ctypes.c_ubyte * nbytes).from_address(tensor.data_ptr())).cast("B")


def read_into(fd: int, offset: int, tensor: torch.Tensor, path: str = "<file>") -> torch.Tensor:
    """Fill contiguous CPU ``tensor`` with bytes from ``fd`` at ``offset``."""
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes == 0:
        return tensor
    view = _byte_view(tensor)
    done = 0
    while done < nbytes:
        count = os.preadv(fd, [view[done:]], offset + done)
        if count <= 0:
            raise CorruptCheckpointError(
                path, f"{nbytes} bytes at byte {offset}", f"the file ending after {done} of them"
            )
        done += count
    return tensor


def read_tensor(fd: int, location: TensorLocation, pin: bool = False) -> torch.Tensor:
    """A new CPU tensor holding the bytes described by ``location``."""
    out = torch.empty(location.shape, dtype=location.dtype, pin_memory=pin)
    return read_into(fd, location.offset, out, location.path)


def write_tensor(path: str, tensor: torch.Tensor) -> None:
    """Write the raw bytes of ``tensor`` (made contiguous, on CPU) to ``path``."""
    data = tensor.detach().to("cpu").contiguous()
    with open(path, "wb") as f:
        if data.numel():
            f.write(_byte_view(data))


class FileHandles:
    """Open read-only descriptors by path, shared by readers and closed together."""

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}

    def get(self, path: str) -> int:
        fd = self._fds.get(path)
        if fd is None:
            fd = self._fds[path] = os.open(path, os.O_RDONLY)
        return fd

    def close(self) -> None:
        for fd in self._fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds.clear()

    def __del__(self) -> None:
        self.close()


def dtype_name(dtype: torch.dtype) -> str:
    """'float16' for torch.float16 (the form used in offload indexes)."""
    return str(dtype).rpartition(".")[2]


def dtype_from_name(name: str) -> torch.dtype:
    value: Any = getattr(torch, name.rpartition(".")[2], None)
    if not isinstance(value, torch.dtype):
        raise CheckpointError(f"Unknown dtype {name!r} in an offload index.")
    return value


class FileMaps:
    """Private (copy-on-write) memory maps by path: tensors made from them share the page cache, no copy."""

    def __init__(self) -> None:
        self._maps: dict[str, mmap.mmap] = {}

    def tensor(self, location: TensorLocation) -> torch.Tensor:
        """A CPU tensor viewing ``location``'s bytes in place (writes stay private to the process)."""
        count = 1
        for dim in location.shape:
            count *= dim
        if count == 0:
            return torch.empty(location.shape, dtype=location.dtype)
        mapped = self._maps.get(location.path)
        if mapped is None:
            with open(location.path, "rb") as f:
                mapped = self._maps[location.path] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        if location.offset % _element_size(location.dtype) == 0:
            flat = torch.frombuffer(mapped, dtype=location.dtype, count=count, offset=location.offset)
        else:  # unaligned: view the bytes, then copy into an aligned tensor
            raw = torch.frombuffer(mapped, dtype=torch.uint8, count=location.nbytes, offset=location.offset)
            flat = raw.clone().view(location.dtype)
        if len(location.shape) == 1:
            return flat  # already its shape
        return flat.as_strided(location.shape, _contiguous_strides(location.shape))  # cheaper than view()

    def close(self) -> None:
        self._maps.clear()  # maps stay open while tensors use them; they close when the last one goes


_STRIDES: dict[tuple[int, ...], tuple[int, ...]] = {}


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides of a contiguous tensor of ``shape`` (kept per shape: a model repeats a few shapes)."""
    strides = _STRIDES.get(shape)
    if strides is None:
        step, out = 1, []
        for dim in reversed(shape):
            out.append(step)
            step *= dim
        strides = _STRIDES[shape] = tuple(reversed(out))
    return strides


MAP_THRESHOLD = 1 << 20  # tensors at least this big are mapped (zero copy) rather than read


def map_tensor(location: TensorLocation) -> torch.Tensor:
    """A CPU tensor over ``location``'s bytes through its own private (copy-on-write) mapping.

    The mapping is released with the tensor, so memory holds only the weights in use. The kernel is
    asked to read the pages ahead (``MADV_WILLNEED``, asynchronous); pre-populating the mapping would
    copy every page of a writable private mapping, which costs more than the forward itself.
    """
    granularity = mmap.ALLOCATIONGRANULARITY
    start = location.offset - location.offset % granularity
    length = location.nbytes + (location.offset - start)
    fd = os.open(location.path, os.O_RDONLY)
    try:
        mapped = mmap.mmap(fd, length, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE, offset=start)
    finally:
        os.close(fd)
    if hasattr(mapped, "madvise") and hasattr(mmap, "MADV_WILLNEED"):
        mapped.madvise(mmap.MADV_WILLNEED)
    inner = location.offset - start
    count = location.nbytes // _element_size(location.dtype)
    if inner % _element_size(location.dtype):
        raw = torch.frombuffer(mapped, dtype=torch.uint8, count=location.nbytes, offset=inner)
        return raw.clone().view(location.dtype).view(location.shape)
    return torch.frombuffer(mapped, dtype=location.dtype, count=count, offset=inner).view(location.shape)


def _split_uniform(
    buffer: torch.Tensor, start: int, run: list[int], locations: list[TensorLocation], out: list[Any]
) -> bool:
    """Fast path for a run of same-dtype, aligned, non-overlapping tensors: one C++ split, then reshapes."""
    dtype = locations[run[0]].dtype
    size = _element_size(dtype)
    if buffer.numel() % size:
        return False
    sizes: list[int] = []
    slots: list[int] = []  # index in ``sizes`` of each tensor of the run
    position = start
    for i in run:
        loc = locations[i]
        if loc.dtype != dtype or loc.offset < position or (loc.offset - start) % size or loc.nbytes == 0:
            return False
        if loc.offset > position:
            sizes.append((loc.offset - position) // size)
        slots.append(len(sizes))
        sizes.append(loc.nbytes // size)
        position = loc.offset + loc.nbytes
    pieces = torch.split_with_sizes(buffer.view(dtype), sizes)
    for i, slot in zip(run, slots):
        out[i] = pieces[slot].view(locations[i].shape)
    return True


def read_coalesced(locations: list[TensorLocation], handles: FileHandles, max_gap: int = 1 << 16) -> list[torch.Tensor]:
    """Read many tensors with as few system calls as possible: byte ranges close together in one file are read at once.

    Returns one CPU tensor per location, in order (views into shared buffers when aligned).
    """
    out: list[torch.Tensor | None] = [None] * len(locations)
    order = sorted(range(len(locations)), key=lambda i: (locations[i].path, locations[i].offset))
    run: list[int] = []

    def flush() -> None:
        if not run:
            return
        first, last = locations[run[0]], max((locations[i] for i in run), key=lambda loc: loc.offset + loc.nbytes)
        start, end = first.offset, last.offset + last.nbytes
        buffer = torch.empty(end - start, dtype=torch.uint8)
        read_into(handles.get(first.path), start, buffer, first.path)
        if _split_uniform(buffer, start, run, locations, out):
            run.clear()
            return
        for i in run:
            loc = locations[i]
            inner = loc.offset - start
            piece = buffer[inner : inner + loc.nbytes]
            if loc.nbytes == 0:
                out[i] = torch.empty(loc.shape, dtype=loc.dtype)
            elif inner % _element_size(loc.dtype):
                out[i] = piece.clone().view(loc.dtype).view(loc.shape)
            else:
                out[i] = piece.view(loc.dtype).view(loc.shape)
        run.clear()

    run_end = -1
    run_path = None
    for i in order:
        loc = locations[i]
        if run and (loc.path != run_path or loc.offset > run_end + max_gap):
            flush()
        if not run:
            run_path, run_end = loc.path, loc.offset
        run.append(i)
        run_end = max(run_end, loc.offset + loc.nbytes)
    flush()
    return out  # type: ignore[return-value]
