"""What a checkpoint folder holds, checked before anything is loaded.

`check_contents()` compares the folder with what the Accelerator prepared (missing and extra entries,
named); `check_folder()` checks every file a load will read (pickles against the allow-lists, damaged
files, links out of the folder), shared out between the processes; `warn_recorded_sizes()` says which
files changed size since the save; `check_model_shapes()` compares the saved weight shapes with the
model. A refused checkpoint leaves every object as it was.
"""

from __future__ import annotations

import functools
import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from accel_state.constants import RNG_STATE_NAME, SCALER_NAME
from accel_train.checkpoint.file_record import compare_files
from accel_train.checkpoint.names import (
    FILE_NAMES,
    MODEL_FILE_PATTERN,
    OPTIMIZER_FILE_PATTERN,
    SHARDED_MODEL_PATTERN,
    CheckpointMismatchError,
    custom_file,
    dataloader_file,
    entry_patterns,
    grads_file,
    matches_any,
    model_file,
    optimizer_file,
    rng_file,
    scheduler_file,
)

logger = logging.getLogger(__name__)


def _indices(entries: list[str], pattern: str, prefer: str | None = None) -> dict[int, str]:
    """``{index: entry}`` of the entries matching ``pattern``; with two for one index, the one ending in ``prefer``."""
    regex = re.compile(pattern)
    out: dict[int, str] = {}
    for entry in sorted(entries):
        match = regex.match(entry)
        if match:
            index = int(next((group for group in match.groups() if group is not None), None) or 0)
            if index not in out or (prefer is not None and entry.endswith(prefer)):
                out[index] = entry
    return out


def check_contents(
    folder: str,
    num_models: int,
    num_optimizers: int,
    num_schedulers: int,
    num_dataloaders: int,
    num_custom: int,
    has_scaler: bool,
    process_index: int,
    num_processes: int,
    manifest: dict[str, Any] | None,
    layout: dict[str, Any] | None = None,
) -> list[str]:
    """Model entries by index; raise `CheckpointMismatchError` listing what is missing or extra.

    ``layout`` maps ``"model"`` / ``"optimizer"`` to the strategy's `CheckpointEntry` (pattern
    and name of each entry); without it the documented single-file names are expected.
    """
    entries = os.listdir(folder)
    if layout is not None and "model" in layout:
        models = _indices(entries, layout["model"].pattern)
        model_namer = layout["model"].name
    else:
        models = _indices(entries, MODEL_FILE_PATTERN, prefer=".safetensors")
        model_namer = lambda i: model_file(i, True)  # noqa: E731
    if layout is not None and "optimizer" in layout:
        optimizers = _indices(entries, layout["optimizer"].pattern)
        optimizer_namer = layout["optimizer"].name
    else:
        optimizers = _indices(entries, OPTIMIZER_FILE_PATTERN)
        optimizer_namer = optimizer_file
    groups = {
        "model": (models, num_models, model_namer),
        "optimizer": (optimizers, num_optimizers, optimizer_namer),
        "scheduler": (_indices(entries, r"^scheduler(?:_(\d+))?\.bin$"), num_schedulers, scheduler_file),
        "custom object": (_indices(entries, r"^custom_checkpoint_(\d+)\.pkl$"), num_custom, custom_file),
    }
    if manifest is not None:
        groups["data loader"] = (
            _indices(entries, r"^dl_state_dict(?:_(\d+))?\.bin$"),
            num_dataloaders,
            dataloader_file,
        )
    missing: list[str] = []
    extra: list[str] = []
    for label, (present, expected, namer) in groups.items():
        for index in range(expected):
            if index not in present:
                missing.append(f"{namer(index)} ({label} {index}; {expected} prepared)")
        for index, entry in sorted(present.items()):
            if index >= expected:
                extra.append(f"{entry} (the checkpoint holds {len(present)} {label}(s), {expected} prepared here)")
    if has_scaler and SCALER_NAME not in entries:
        missing.append(f"{SCALER_NAME} (fp16 gradient scaler)")
    saved_processes = manifest.get("num_processes") if manifest else None
    own_rng = rng_file(process_index)
    rng_present = own_rng in entries or f"{RNG_STATE_NAME}_{process_index}.pkl" in entries
    callers_only = manifest is not None and manifest.get("process_files") == "callers"  # saved by the main one alone
    if not rng_present and saved_processes in (None, num_processes) and not callers_only:
        missing.append(f"{own_rng} (random states of process {process_index})")
    if missing or extra:
        lines = [f"checkpoint {folder} does not match what this Accelerator prepared:"]
        if missing:
            lines.append("  missing: " + "; ".join(missing))
        if extra:
            lines.append("  extra: " + "; ".join(extra))
        lines.append("  Prepare the same models, optimizers, schedulers and registered objects as when it was saved.")
        if not models and _indices(entries, SHARDED_MODEL_PATTERN):
            lines.append(
                f"  It holds sharded state ({FILE_NAMES['sharded_model']}_0/, written by FSDP or the ND strategy), "
                "which this run does not read: load it with FullyShardedDataParallelPlugin(fsdp_version=2, "
                'state_dict_type="SHARDED_STATE_DICT") on any number of processes, or merge the weights into one '
                "file with `accel merge-weights`."
            )
        raise CheckpointMismatchError("\n".join(lines))
    return [models[i] for i in range(num_models)]


def warn_recorded_sizes(folder: str, manifest: Mapping[str, Any] | None) -> list[str]:
    """Say which files the manifest records (``files``) hold another size than when they were saved: cut
    short, grown, or replaced by another save's. One stat per recorded file; nothing is read.

    A warning, not a refusal: a file cut short or garbled is refused by `check_folder()` already, and a
    well-formed file put in place on purpose (other weights of the same model, another run's random
    states) loads as the documented system loads it. Files gone since are left to `check_contents()` and
    `check_folder()`, which name what a load needs; a manifest without the record (older accel, another
    writer) says nothing.

    Args:
        folder: the checkpoint folder.
        manifest: its manifest (`None`: none).

    Returns:
        one line per such file (also logged as a warning), naming it and both sizes.
    """
    recorded = manifest.get("files") if manifest is not None else None
    if not isinstance(recorded, Mapping):
        return []
    lines = [
        f"checkpoint file {os.path.join(folder, relative)!r} holds {actual} bytes, but the save recorded "
        f"{size}: it changed after the save (loaded as it is now)"
        for relative, size, actual in compare_files(folder, recorded, with_extra=False).resized
    ]
    for line in lines:
        logger.warning(line)
    return lines


#: The ``torch.save`` files of the layout that a load reads (``random_states_{rank}.pkl`` of other tools
#: is never read, so never checked).
_READ_TORCH_FILE_RE = re.compile(
    r"^(pytorch_model(_\d+)?\.bin|(optimizer|scheduler|sampler|dl_state_dict)(_\d+)?\.bin|scaler\.pt"
    r"|custom_checkpoint_\d+\.pkl|pytorch_model_fsdp(_\d+)?\.bin|pytorch_model_fsdp_\d+_rank\d+\.bin)$"
)


#: The folders of the layout that a load reads: DCP folders and a DeepSpeed engine's tag folder.
_READ_FOLDER_RE = re.compile(r"^(pytorch_model(_fsdp)?(_\d+)?|optimizer_\d+)$")
_READ_WEIGHTS_RE = re.compile(r"^model(_\d+)?\.safetensors$")


def _read_patterns(entries: Mapping[str, Any] | None) -> list[re.Pattern[str]]:
    """The patterns of the sub-folders a load reads: the documented ones and the strategy's entries."""
    return [_READ_FOLDER_RE, *entry_patterns(entries)]


def folder_checks(
    folder: str,
    io_: Any,
    ranks: Sequence[int] | None = None,
    entries: Mapping[str, Any] | None = None,
    failed: Callable[[str, BaseException], None] | None = None,
) -> list[tuple[str, Callable[[], None]]]:
    """The checks of every file a load of ``folder`` reads, as ``(label, check)`` in a stable order (see
    `check_folder()`, which runs them). A label starts with the file's or folder's path relative to
    ``folder``. Planning already reads what is small: a DCP folder's ``.metadata`` (refused, naming a
    missing data file or one shorter than its items), and refuses a link out of the checkpoint.

    Args:
        folder: the checkpoint folder.
        io_: the `CheckpointIO` whose checks apply.
        ranks: the processes whose own files (random states, gradients) are checked; all present when
            not given.
        entries: the strategy's checkpoint entries (`check_folder()`).
        failed: called with an entry and the error when planning that entry's checks fails, after which the
            other entries are still planned (``accel checkpoint inspect`` reports every damaged entry);
            without it, the first such error is raised.
    """
    from accel_bigmodel.confine import allowed_root, check_confined
    from accel_train.checkpoint.integrity import check_rng_file, check_weights_file
    from accel_train.checkpoint.layout import DCP_FOLDER_RE, engine_torch_files, torch_files

    patterns = _read_patterns(entries)
    sharded_patterns = [DCP_FOLDER_RE, *entry_patterns(entries, sharded_only=True)]
    names = sorted(os.listdir(folder))
    root = allowed_root(folder)
    checks: list[tuple[str, Callable[[], None]]] = []
    verified: set[bytes] = set()  # item pickles checked, shared by the model's and optimizer's folders

    def file_check(relative: str, check: Callable[[str], Any] | None = None) -> tuple[str, Callable[[], None]]:
        path = os.path.join(folder, relative)
        check_confined(path, folder, root=root)  # a link out of the checkpoint is refused, by name
        return f"{relative}:{os.path.getsize(path)}", functools.partial(check or io_.check_file, path)

    def confine_tree(entry: str) -> None:
        """Refuse a link anywhere in the sub-folder ``entry`` (itself included) that resolves outside."""
        top = os.path.join(folder, entry)
        check_confined(top, folder, root=root)
        for current, dirs, files in os.walk(top):
            for name in sorted(dirs) + sorted(files):
                check_confined(os.path.join(current, name), folder, root=root)

    def plan_entry(entry: str) -> list[tuple[str, Callable[[], None]]]:
        path = os.path.join(folder, entry)
        if os.path.isdir(path):
            if not matches_any(entry, patterns):
                return []  # a folder of the user's, moved along with the checkpoint: never read
            confine_tree(entry)
            if matches_any(entry, sharded_patterns) and os.path.isfile(os.path.join(path, ".metadata")):
                found = io_.sharded_checks(path, verified)  # torch's reader opens the files its .metadata names
                planned = [(f"{entry}/{label}", check) for label, check in found]
                # and a backend may open pickled files beside it (Megatron-LM's common.pt): those too
                return planned + [file_check(os.path.join(entry, relative)) for relative in torch_files(path)]
            # an engine folder (or a sharded one without metadata): every pickled file in it, whatever else
            # it holds; a DCP .metadata in it is refused by name, never taken as the sign of a DCP folder
            return [file_check(os.path.join(entry, relative)) for relative in engine_torch_files(path)]
        if _READ_TORCH_FILE_RE.match(entry):
            return [file_check(entry)]
        if _READ_WEIGHTS_RE.match(entry):
            return [file_check(entry, check_weights_file)]
        return []

    per_process = re.compile(rf"^(?:{FILE_NAMES['rng']}|{FILE_NAMES['grads']})_(\d+)\.safetensors$")
    present = sorted({int(match.group(1)) for match in map(per_process.match, names) if match})
    own_files = [
        (name, check)
        for rank in (present if ranks is None else ranks)
        for name, check in ((rng_file(rank), check_rng_file), (grads_file(rank), check_weights_file))
        if os.path.isfile(os.path.join(folder, name))
    ]
    for entry in names:
        try:
            checks.extend(plan_entry(entry))
        except Exception as error:
            if failed is None:
                raise
            failed(entry, error)
    for name, check in own_files:
        try:
            checks.append(file_check(name, check))
        except Exception as error:
            if failed is None:
                raise
            failed(name, error)
    return checks


def check_folder(
    folder: str,
    io_: Any,
    distributed: bool = False,
    ranks: Sequence[int] | None = None,
    entries: Mapping[str, Any] | None = None,
) -> None:
    """Check every file a load of ``folder`` reads before anything is loaded, so that a refused or damaged
    file leaves the model and optimizer untouched: ``torch.save`` files of the layout (``io_.check_file``),
    safetensors weights and the random states and gradients of ``ranks`` (their headers:
    `integrity`), the DCP folders of the layout (``pytorch_model_fsdp_{i}/``, ``optimizer_{i}/``:
    ``io_.sharded_checks``, metadata and every item) and a backend's own sub-folders (every ``.pt`` /
    ``.bin`` / ``.pkl`` / ``.pth`` in them at any depth, a DeepSpeed tag for example: the kind of a folder
    comes from its name, so a ``.metadata`` planted there is refused instead of turning the checks off).
    With ``distributed`` and a folder that the processes read together (sharded or engine state), each
    process checks its share and all raise the same error (`run_checks()`). The checks are those of
    `folder_checks()`.

    Args:
        folder: the checkpoint folder.
        io_: the `CheckpointIO` whose checks apply.
        distributed: whether every process of the run calls this on the same folder.
        ranks: the processes whose own files (random states, gradients) this load reads; all present when
            not given.
        entries: the checkpoint entries of the strategy that will read the folder
            (`Strategy.checkpoint_entries()`): a sub-folder matching one of their patterns is read by
            that strategy, so it is checked like the documented ones (a pipeline's ``pytorch_model_pp_0/``,
            Megatron-LM's ``megatron_model_0/``).

    Every file checked, and everything under a sub-folder that is read, must resolve inside ``folder``
    (symbolic links followed; a folder in the Hugging Face hub cache may link into its ``blobs/``).

    Raises:
        UnsafeCheckpointError: a file would run code when unpickled (named, with what it asks for), a
            DCP ``.metadata`` lies in a DeepSpeed engine folder (named), or a symbolic link resolves outside
            the checkpoint (the link and its target named).
        CorruptCheckpointError: a file is damaged (named, with what was expected and found).
    """
    from accel_train.checkpoint.safety import run_checks

    patterns = _read_patterns(entries)
    shared = distributed and any(
        matches_any(entry, patterns) and os.path.isdir(os.path.join(folder, entry)) for entry in os.listdir(folder)
    )
    run_checks(lambda: folder_checks(folder, io_, ranks=ranks, entries=entries), distributed=shared)


def check_model_shapes(folder: str, models: Sequence[Any], model_entries: Sequence[str], strategy: Any) -> None:
    """Compare the shape of every tensor in each model's ``.safetensors`` file (its header only) with the
    model's own before any model is loaded: ``load_state_dict`` copies the tensors that fit and raises on a
    size mismatch only afterwards, which would leave a model half loaded. Applies where the strategy loads a
    whole file into the unwrapped model (the default reader); other strategies check their own shards.

    Raises:
        CheckpointMismatchError: a tensor's shape differs (file, tensor and both shapes named).
    """
    from accel_bigmodel.tensor_io import read_safetensors_header
    from accel_train.strategies.base import Strategy

    if type(strategy).load_model_checkpoint is not Strategy.load_model_checkpoint:
        return
    for model, entry in zip(models, model_entries):
        path = os.path.join(folder, entry)
        if not entry.endswith(".safetensors") or not os.path.isfile(path):
            continue
        locations, _ = read_safetensors_header(path)
        own = strategy.unwrap_model(model, keep_torch_compile=False).state_dict()
        for name, location in locations.items():
            key = name[len("module.") :] if name.startswith("module.") and name not in own else name
            tensor = own.get(key)
            if isinstance(tensor, torch.Tensor) and tuple(tensor.shape) != tuple(location.shape):
                raise CheckpointMismatchError(
                    f"checkpoint {folder} does not match what this Accelerator prepared: {entry} holds {name!r} of "
                    f"shape {tuple(location.shape)}, the model's is {tuple(tensor.shape)}; nothing was loaded. "
                    "Prepare the same model as when it was saved."
                )
