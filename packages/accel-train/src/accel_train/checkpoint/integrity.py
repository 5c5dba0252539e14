"""Damaged checkpoint files: found before anything is loaded, and told apart from refused ones.

A file cut short or with garbled bytes raises `CorruptCheckpointError`
naming it, what was expected there and what was found; a well-formed file that asks to run code stays
an `UnsafeCheckpointError`. ``load_state`` runs these checks on every file
it will read (`check_folder()`) before loading any, so a damaged file
leaves the model and optimizer as they were.

=====================================  ======================================================================
file                                   damaged when
=====================================  ======================================================================
``model.safetensors``, RNG and         the file is shorter or longer than its header says, or the header is
gradient ``.safetensors`` files        not JSON (`check_safetensors_file()`)
``random_states_{rank}.safetensors``   also: the generator states in its header are not the JSON written
``optimizer.bin`` and other            the zip is cut short or its directory garbled, a record lies outside
``torch.save`` files                   the file, the pickle's CRC-32 differs, or the pickle stream ends early
                                       or holds a byte that is no opcode (`accel_bigmodel.integrity`)
``accel_checkpoint.json``              it is not JSON, or not an object with the manifest's fields
                                       (`accel_train.checkpoint.manifest`, which reads it without torch)
=====================================  ======================================================================
"""

from __future__ import annotations

import json
import pickle
from typing import Any, BinaryIO

from accel_bigmodel.integrity import damaged_torch_file, pickle_damage
from accel_bigmodel.tensor_io import check_safetensors_file
from accel_state.errors import CorruptCheckpointError, UnsafeCheckpointError
from accel_train.checkpoint.manifest import read_manifest_file

__all__ = [
    "check_rng_file",
    "check_weights_file",
    "is_weights_only_error",
    "read_manifest_file",
    "torch_load_failure",
]

#: How much of a refused file is read to name the globals it asks for.
SCAN_LIMIT = 64 * 1024 * 1024

#: The generator states an RNG file's header holds as JSON: key -> number of items (numpy's is optional).
_RNG_JSON = {"random_state": 3, "numpy_random_seed": 5}
#: Where the words of each JSON generator state are (item index) and how many there are (Mersenne Twister).
_JSON_WORDS = {"random_state": (1, 625), "numpy_random_seed": (1, 624)}


def is_weights_only_error(error: BaseException) -> bool:
    """Whether ``error`` is torch's weights-only reader refusing (or failing on) a pickle.

    Args:
        error: what ``torch.load(weights_only=True)`` raised.
    """
    if isinstance(error, pickle.UnpicklingError):
        return True
    text = str(error)
    return "weights_only" in text or "Weights only load failed" in text


def _read_start(path: str, stream: BinaryIO | None) -> bytes | None:
    try:
        if stream is not None:
            stream.seek(0)
            return stream.read(SCAN_LIMIT)
        with open(path, "rb") as handle:
            return handle.read(SCAN_LIMIT)
    except OSError:
        return None


def torch_load_failure(
    path: str, error: BaseException, stream: BinaryIO | None = None, pickled: bytes | None = None
) -> BaseException:
    """The error to raise for a ``torch.save`` file (or one of its pickles) that torch's weights-only reader
    failed on: `CorruptCheckpointError` when the file is damaged, `UnsafeCheckpointError`
    when a well-formed pickle was refused, else ``error`` itself (an I/O error, a device missing here ...).

    Args:
        path: the file named in the error.
        error: what the reader raised.
        stream: the file's content when it is not read from ``path`` (a DCP item, bytes in memory).
        pickled: the pickle alone, when only it was read (its zip was checked before).
    """
    if isinstance(error, OSError):
        return error
    if pickled is not None:
        found = pickle_damage(pickled)
        damaged = None if found is None else CorruptCheckpointError(path, "a well-formed pickle", found)
    else:
        damaged = damaged_torch_file(path, stream)
    if damaged is not None:
        return damaged
    if is_weights_only_error(error):
        from accel_train.checkpoint.safety import unsafe_found

        return UnsafeCheckpointError(
            path, unsafe_found(error, pickled if pickled is not None else _read_start(path, stream))
        )
    text = str(error)
    if isinstance(error, EOFError) or (
        isinstance(error, RuntimeError) and ("PytorchStreamReader" in text or "zip" in text)
    ):
        first = next((line.strip() for line in text.splitlines() if line.strip()), type(error).__name__)
        return CorruptCheckpointError(
            path, "a torch.save file torch can read", f"{type(error).__name__}: {first[:200]}"
        )
    return error


def check_weights_file(path: str) -> None:
    """Raise `CorruptCheckpointError` when the safetensors file ``path`` is shorter or longer than its
    header says, or its header is broken; reads the header only.

    Args:
        path: a ``.safetensors`` file of the checkpoint (model weights, accumulated gradients).
    """
    check_safetensors_file(path)


def check_rng_file(path: str, rng_format: str = "accel-rng-1") -> dict[str, str]:
    """Check ``random_states_{rank}.safetensors`` as `check_weights_file()` does, and the generator states
    its header holds as JSON; returns the header's metadata. A file of another format is left to the reader
    (it says which format it found).

    Args:
        path: the RNG state file.
        rng_format: the ``format`` of accel's RNG files (``file_io.RNG_FORMAT``).

    Raises:
        CorruptCheckpointError: the file or the states in its header are damaged.
    """
    locations, metadata = check_safetensors_file(path)
    if metadata.get("format") != rng_format:
        return metadata
    if "torch_manual_seed" not in locations:
        raise CorruptCheckpointError(path, "torch's generator state 'torch_manual_seed'", "a header without it")
    for key, length in _RNG_JSON.items():
        if key not in metadata:
            if key == "random_state":
                raise CorruptCheckpointError(path, "Python's generator state 'random_state'", "a header without it")
            continue
        try:
            value = json.loads(metadata[key])
        except ValueError as err:
            raise CorruptCheckpointError(
                path, f"the generator state {key!r} in JSON", f"text that is not ({err})"
            ) from None
        if not isinstance(value, list) or len(value) != length:
            raise CorruptCheckpointError(
                path, f"the generator state {key!r} as a list of {length} items", f"{str(value)[:80]!r}"
            )
        _check_json_state(path, key, value)
    _check_xla_seed(path, metadata)
    _check_torch_states(path, locations)
    return metadata


def _check_xla_seed(path: str, metadata: dict[str, str]) -> None:
    """torch_xla's generator seed, when saved, is a decimal integer in [0, 2**64) (``xm.set_rng_state`` takes
    nothing else, and would only say so after the model and optimizer were loaded)."""
    raw = metadata.get("xla_manual_seed")
    if raw is None:
        return
    if not (raw.isascii() and raw.isdigit() and int(raw) < 2**64):
        raise CorruptCheckpointError(
            path, "torch_xla's generator seed 'xla_manual_seed' as an unsigned 64-bit integer", f"{raw[:80]!r}"
        )


def _check_json_state(path: str, key: str, value: list[Any]) -> None:
    """Python's and NumPy's generator states hold a fixed number of 32-bit words; any other count would
    make ``random.setstate`` / ``np.random.set_state`` fail after other objects were already loaded."""
    position, expected = _JSON_WORDS[key]
    words = value[position]
    if not isinstance(words, list) or len(words) != expected:
        found = f"{len(words)} items" if isinstance(words, list) else type(words).__name__
        raise CorruptCheckpointError(path, f"the generator state {key!r} with {expected} words", found)


def _check_torch_states(path: str, locations: dict[str, Any]) -> None:
    """Each torch generator state in the file must have the dtype and length this torch's generators take
    (``torch.set_rng_state`` refuses any other, but only once the model and optimizer were loaded)."""
    import torch

    cpu_state = torch.get_rng_state()
    expected = {"torch_manual_seed": cpu_state}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        expected.update(
            {f"torch_cuda_manual_seed.{i}": state for i, state in enumerate(torch.cuda.get_rng_state_all())}
        )
    for name, location in locations.items():
        if name.startswith("generator.") and (location.dtype != torch.uint8 or len(location.shape) != 1):
            # a generator given by name may live on any device (its state's length differs): bytes, one row
            raise CorruptCheckpointError(
                path,
                f"the generator state {name!r} as a 1-D torch.uint8 tensor",
                f"{location.dtype} of shape {tuple(location.shape)}",
            )
        want = expected.get(name)
        if want is None:
            continue
        if location.dtype != want.dtype or tuple(location.shape) != tuple(want.shape):
            raise CorruptCheckpointError(
                path,
                f"the generator state {name!r} as {want.dtype} of shape {tuple(want.shape)} (what this torch takes)",
                f"{location.dtype} of shape {tuple(location.shape)}",
            )
