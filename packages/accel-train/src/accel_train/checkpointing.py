"""``save_state`` / ``load_state``: the documented checkpoint layout, written atomically, read safely.

A checkpoint is written into a hidden sibling folder ``.<name>.<token>.partial`` (one per save, written
by one save at a time: `accel_train.checkpoint.folder_lock`) and renamed into place only
once every process has finished its files, so a process killed during ``save_state`` leaves the
previous checkpoint intact and nothing that ``load_state`` would pick. ``total_limit`` removes older
checkpoints only after the new one is complete. Loading never unpickles objects (see
`accel_train.checkpoint.file_io` for the formats) and checks that the folder holds what this
Accelerator prepared, listing what is missing or extra.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import re
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from accel_state.constants import (
    CUSTOM_CHECKPOINT_PREFIX,
    DATALOADER_NAME,
    FSDP_MODEL_NAME,
    MODEL_NAME,
    OPTIMIZER_NAME,
    RNG_STATE_NAME,
    SAFE_MODEL_NAME,
    SCALER_NAME,
    SCHEDULER_NAME,
)
from accel_train.checkpoint.numbering import list_checkpoints

logger = logging.getLogger(__name__)

CHECKPOINTS_FOLDER = "checkpoints"
MANIFEST_NAME = "accel_checkpoint.json"

#: Every name a checkpoint folder holds, by kind (the documented layout, one table for every strategy).
#: A value is the stem: index 0 is ``stem.suffix``, index i ``stem_i.suffix`` (folders: ``stem_i``).
FILE_NAMES: dict[str, str] = {
    "model": SAFE_MODEL_NAME,  # model.safetensors
    "model_bin": MODEL_NAME,  # pytorch_model.bin
    "sharded_model": FSDP_MODEL_NAME,  # pytorch_model_fsdp_{i}/ (a torch.distributed.checkpoint folder)
    "optimizer": OPTIMIZER_NAME,  # optimizer.bin, or optimizer_{i}/ when sharded
    "scheduler": SCHEDULER_NAME,
    "dataloader": DATALOADER_NAME,
    "scaler": SCALER_NAME,
    "rng": RNG_STATE_NAME,
    "grads": "accumulated_grads",
    "custom": CUSTOM_CHECKPOINT_PREFIX,
    "manifest": MANIFEST_NAME,
    "engine": MODEL_NAME,  # pytorch_model_{i}/: a DeepSpeed engine's own checkpoint tag
    "engine_optimizer": "deepspeed_optimizer",  # deepspeed_optimizer_{i}.json: its optimizer's marker
}

_OWNED_RE = re.compile(
    r"^((model|pytorch_model)(_\d+)?\.(safetensors|bin)|(optimizer|scheduler|sampler|dl_state_dict)(_\d+)?\.bin"
    r"|scaler\.pt|random_states_\d+\.(pkl|safetensors)|accumulated_grads_\d+\.safetensors|custom_checkpoint_\d+\.pkl"
    r"|accel_checkpoint\.json"
    r"|pytorch_model_fsdp(_\d+)?(\.bin)?|optimizer_\d+|pytorch_model_fsdp_\d+_rank\d+\.bin)$"
)

#: Regular expressions over folder entries, by kind; the first group that matched is the index.
MODEL_FILE_PATTERN = r"^(?:model(?:_(\d+))?\.safetensors|pytorch_model(?:_(\d+))?\.bin)$"
OPTIMIZER_FILE_PATTERN = r"^optimizer(?:_(\d+))?\.bin$"
SHARDED_MODEL_PATTERN = rf"^{FSDP_MODEL_NAME}(?:_(\d+))?$"
#: an FSDP ``FULL_STATE_DICT`` model as the reference release writes it (a torch file of the full state dict)
FSDP_FULL_MODEL_PATTERN = rf"^{FSDP_MODEL_NAME}(?:_(\d+))?\.bin$"
SHARDED_OPTIMIZER_PATTERN = rf"^{OPTIMIZER_NAME}_(\d+)$"


class CheckpointMismatchError(ValueError):
    """The checkpoint folder does not hold what this Accelerator prepared."""


def indexed(stem: str, index: int, suffix: str) -> str:
    """``stem.suffix`` for index 0, ``stem_{index}.suffix`` after it (the documented naming)."""
    return f"{stem}.{suffix}" if index == 0 else f"{stem}_{index}.{suffix}"


def model_file(index: int, safe_serialization: bool) -> str:
    """``model.safetensors`` / ``pytorch_model.bin`` (``_{index}`` after the first)."""
    if safe_serialization:
        return indexed(FILE_NAMES["model"], index, "safetensors")
    return indexed(FILE_NAMES["model_bin"], index, "bin")


def sharded_model_dir(index: int) -> str:
    """``pytorch_model_fsdp_{index}``: the folder of a model's shards (every index numbered)."""
    return f"{FILE_NAMES['sharded_model']}_{index}"


def sharded_optimizer_dir(index: int) -> str:
    """``optimizer_{index}``: the folder of an optimizer's shards (every index numbered)."""
    return f"{FILE_NAMES['optimizer']}_{index}"


def optimizer_file(index: int) -> str:
    return indexed(FILE_NAMES["optimizer"], index, "bin")


def scheduler_file(index: int) -> str:
    return indexed(FILE_NAMES["scheduler"], index, "bin")


def dataloader_file(index: int) -> str:
    return indexed(FILE_NAMES["dataloader"], index, "bin")


def rng_file(rank: int) -> str:
    return f"{FILE_NAMES['rng']}_{rank}.safetensors"


def grads_file(rank: int) -> str:
    """Gradients accumulated so far, when a checkpoint is taken between two optimizer steps."""
    return f"{FILE_NAMES['grads']}_{rank}.safetensors"


def custom_file(index: int) -> str:
    return f"{FILE_NAMES['custom']}_{index}.pkl"


def partial_dir(final_dir: str, token: str | None = None) -> str:
    """The hidden folder a save of ``final_dir`` writes into: ``.<name>.<token>.partial`` (one per save, so
    two writers never share one), or ``.<name>.partial`` without a token."""
    parent, name = os.path.split(os.path.abspath(final_dir))
    middle = f".{token}" if token else ""
    return os.path.join(parent, f".{name}{middle}.partial")


def new_save_token() -> str:
    """A fresh name part for one save's partial folder."""
    import secrets

    return secrets.token_hex(4)


def _stale_partials(final_dir: str) -> list[str]:
    """Partial folders of earlier saves of ``final_dir`` that never finished (killed mid-save)."""
    parent, name = os.path.split(os.path.abspath(final_dir))
    pattern = re.compile(rf"^\.{re.escape(name)}(\.[0-9a-f]+)?\.partial$")
    try:
        entries = os.listdir(parent)
    except FileNotFoundError:
        return []
    return [os.path.join(parent, entry) for entry in entries if pattern.match(entry)]


def _old_dir(final_dir: str) -> str:
    parent, name = os.path.split(os.path.abspath(final_dir))
    return os.path.join(parent, f".{name}.old")


def begin(final_dir: str, token: str) -> str:
    """Create this save's empty partial folder and return its path; the writer calls it holding the
    folder's lock (`accel_train.checkpoint.folder_lock`), so the partial folders of earlier saves of
    the same folder are leftovers of killed saves, and are removed first.

    Args:
        final_dir: the checkpoint folder being saved.
        token: this save's name part (`new_save_token()`).
    """
    for stale in _stale_partials(final_dir):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = partial_dir(final_dir, token)
    os.makedirs(tmp)
    return tmp


def _exchange(a: str, b: str) -> bool:
    """Swap two existing paths in one atomic step (Linux ``renameat2(RENAME_EXCHANGE)``); False where the
    system cannot (another OS, an old kernel or file system), and the caller renames twice instead."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    result = renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange)
    if result == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, f"could not swap {b} into place: {os.strerror(code)}", b)


def swap_into_place(tmp: str, final_dir: str, owned: Callable[[str], bool]) -> None:
    """Put the complete folder ``tmp`` at ``final_dir``; a kill at any moment leaves the previous folder or
    the new one there (never a mix). Entries of the previous folder that ``owned`` does not claim (files
    the user put there) move into the new one first; the previous folder is removed only once the new one
    is in place (where the system cannot swap atomically, it waits as ``.<name>.old``, which a load finds).
    """
    final_dir = os.path.abspath(final_dir)
    if not os.path.exists(final_dir):
        os.rename(tmp, final_dir)
        return
    if not os.path.isdir(final_dir):
        raise NotADirectoryError(f"cannot write to {final_dir}: it is a file")
    for entry in os.listdir(final_dir):
        if not owned(entry) and not os.path.exists(os.path.join(tmp, entry)):
            os.rename(os.path.join(final_dir, entry), os.path.join(tmp, entry))
    if _exchange(tmp, final_dir):
        shutil.rmtree(tmp, ignore_errors=True)  # now the previous folder
        return
    old = _old_dir(final_dir)
    if os.path.exists(old):
        shutil.rmtree(old)
    os.rename(final_dir, old)
    os.rename(tmp, final_dir)
    shutil.rmtree(old, ignore_errors=True)


def _entry_patterns(entries: Mapping[str, Any] | None, sharded_only: bool = False) -> list[re.Pattern[str]]:
    """The compiled patterns of a strategy's checkpoint entries (`Strategy.checkpoint_entries()`); with
    ``sharded_only``, of those that are ``torch.distributed.checkpoint`` folders only."""
    chosen = [entry for entry in (entries or {}).values() if entry.sharded or not sharded_only]
    return [re.compile(entry.pattern) for entry in chosen]


def publish(tmp: str, final_dir: str, entries: Mapping[str, Any] | None = None) -> None:
    """Rename the complete partial folder into place, replacing an older one of the same name atomically.

    Args:
        tmp: the complete partial folder.
        final_dir: where it goes.
        entries: the checkpoint entries of the strategy that saved (`Strategy.checkpoint_entries()`): a
            previous folder's entries of that kind are the checkpoint's, not the user's, so they are not
            carried into the new folder (the documented names are always the checkpoint's).
    """
    patterns = _entry_patterns(entries)
    swap_into_place(tmp, final_dir, lambda entry: bool(_OWNED_RE.match(entry) or _matches(entry, patterns)))


def _matches(entry: str, patterns: Sequence[re.Pattern[str]]) -> bool:
    return any(pattern.match(entry) for pattern in patterns)


def discard(tmp: str) -> None:
    """Remove a partial folder after a failed save (the previous checkpoint is untouched)."""
    shutil.rmtree(tmp, ignore_errors=True)


def resolve_input_dir(input_dir: str) -> str:
    """The folder to load: ``input_dir``, or the previous copy left by a save killed mid-swap."""
    if os.path.isdir(input_dir):
        name = os.path.basename(os.path.normpath(input_dir))
        if name.startswith(".") and name.endswith(".partial"):
            raise CheckpointMismatchError(
                f"{input_dir} is an incomplete checkpoint (a save was interrupted); load another one"
            )
        return input_dir
    old = _old_dir(input_dir)
    if os.path.isdir(old):
        logger.warning("%s is missing but its previous version %s is complete: loading that", input_dir, old)
        return old
    raise FileNotFoundError(f"Tried to find {input_dir} but folder does not exist: no checkpoint folder there")


def prune(base: str, total_limit: int | None, keep: str) -> list[str]:
    """Delete the oldest complete checkpoints so that at most ``total_limit`` remain; never ``keep``."""
    if total_limit is None:
        return []
    checkpoints = [path for _, path in list_checkpoints(base)]
    removed = []
    while len(checkpoints) > total_limit:
        oldest = checkpoints.pop(0)
        if os.path.abspath(oldest) == os.path.abspath(keep):
            continue
        shutil.rmtree(oldest, ignore_errors=True)
        removed.append(oldest)
    return removed


# -- what a folder holds compared with what is expected ---------------------------------------------


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


#: The ``torch.save`` files of the layout that a load reads (``random_states_{rank}.pkl`` of other tools
#: is never read, so never checked).
_READ_TORCH_FILE_RE = re.compile(
    r"^(pytorch_model(_\d+)?\.bin|(optimizer|scheduler|sampler|dl_state_dict)(_\d+)?\.bin|scaler\.pt"
    r"|custom_checkpoint_\d+\.pkl|pytorch_model_fsdp(_\d+)?\.bin|pytorch_model_fsdp_\d+_rank\d+\.bin)$"
)


#: The folders of the layout that a load reads: DCP folders and a DeepSpeed engine's tag folder.
_READ_FOLDER_RE = re.compile(r"^(pytorch_model(_fsdp)?(_\d+)?|optimizer_\d+)$")
_READ_WEIGHTS_RE = re.compile(r"^model(_\d+)?\.safetensors$")


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
    process checks its share and all raise the same error (`run_checks()`).

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
    from accel_bigmodel.confine import allowed_root, check_confined
    from accel_train.checkpoint.integrity import check_rng_file, check_weights_file
    from accel_train.checkpoint.layout import DCP_FOLDER_RE, engine_torch_files, torch_files
    from accel_train.checkpoint.safety import run_checks

    patterns = [_READ_FOLDER_RE, *_entry_patterns(entries)]
    sharded_patterns = [DCP_FOLDER_RE, *_entry_patterns(entries, sharded_only=True)]
    names = sorted(os.listdir(folder))

    def read_folder(entry: str) -> bool:
        """Whether ``entry`` is a sub-folder that the load reads."""
        return _matches(entry, patterns) and os.path.isdir(os.path.join(folder, entry))

    shared = distributed and any(read_folder(e) for e in names)

    root = allowed_root(folder)

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

    def plan() -> list[tuple[str, Callable[[], None]]]:
        checks: list[tuple[str, Callable[[], None]]] = []
        verified: set[bytes] = set()  # item pickles checked, shared by the model's and optimizer's folders

        def sharded(relative: str) -> None:
            found = io_.sharded_checks(os.path.join(folder, relative), verified)
            checks.extend((f"{relative}/{label}", check) for label, check in found)

        for entry in names:
            path = os.path.join(folder, entry)
            if os.path.isdir(path):
                if not read_folder(entry):
                    continue  # a folder of the user's, moved along with the checkpoint: never read
                confine_tree(entry)
                if _matches(entry, sharded_patterns) and os.path.isfile(os.path.join(path, ".metadata")):
                    sharded(entry)  # torch's reader opens the files its .metadata names
                    # and a backend may open pickled files beside it (Megatron-LM's common.pt): those too
                    for relative in torch_files(path):
                        checks.append(file_check(os.path.join(entry, relative)))
                    continue
                # an engine folder (or a sharded one without metadata): every pickled file in it, whatever else
                # it holds; a DCP .metadata in it is refused by name, never taken as the sign of a DCP folder
                for relative in engine_torch_files(path):
                    checks.append(file_check(os.path.join(entry, relative)))
            elif _READ_TORCH_FILE_RE.match(entry):
                checks.append(file_check(entry))
            elif _READ_WEIGHTS_RE.match(entry):
                checks.append(file_check(entry, check_weights_file))
        per_process = re.compile(rf"^(?:{FILE_NAMES['rng']}|{FILE_NAMES['grads']})_(\d+)\.safetensors$")
        present = sorted({int(match.group(1)) for match in map(per_process.match, names) if match})
        for rank in present if ranks is None else ranks:
            for name, check in ((rng_file(rank), check_rng_file), (grads_file(rank), check_weights_file)):
                if os.path.isfile(os.path.join(folder, name)):
                    checks.append(file_check(name, check))
        return checks

    run_checks(plan, distributed=shared)


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


def to_device(obj: Any, device: Any) -> Any:
    from accel_state.nested import send_to_device

    return send_to_device(obj, device) if device is not None else obj


def torch_device(value: Any, default: torch.device) -> Any:
    if value in (None, "on_device"):
        return default
    return value


# -- the one walk over the registered objects (save_state, load_state and the module-level functions) --


@dataclass
class TrainingObjects:
    """The objects a checkpoint holds, each kind in registration order.

    ``scaler`` is anything with ``state_dict`` / ``load_state_dict`` (the precision, or a gradient
    scaler); nothing is written for it when its ``state_dict()`` is ``None``.
    """

    models: Sequence[Any] = ()
    optimizers: Sequence[Any] = ()
    schedulers: Sequence[Any] = ()
    dataloaders: Sequence[Any] = ()
    custom: Sequence[Any] = ()
    scaler: Any = None


def write_objects(
    folder: str,
    objects: TrainingObjects,
    strategy: Any,
    *,
    weights: Sequence[Any],
    is_writer: bool,
    process_index: int,
    safe_serialization: bool = True,
    loader_state: Callable[[Any], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Write every object of ``objects`` into ``folder``; called on every rank. Returns the entries written.

    Models and optimizers are written by the strategy (its entries: full files on the writer, or
    shards from every rank); schedulers, loader positions, the scaler and custom objects by the writer;
    the random states by every rank. Every file goes through ``strategy.checkpoint_io``.

    Args:
        folder: the (partial) checkpoint folder, existing.
        objects: what to save.
        strategy: the strategy of the run (its checkpoint entries and ``checkpoint_io``).
        weights: ``(model, state_dict)`` pairs to write (state dict ``None`` when the strategy writes shards).
        is_writer: whether this process writes the shared files.
        process_index: this process's rank (names its random-state file).
        safe_serialization: safetensors (True) or ``torch.save`` (False) for model weights.
        loader_state: the state of a data loader to write (default: ``loader.state_dict()``).
    """
    io_ = strategy.checkpoint_io
    written: dict[str, Any] = {"models": [], "optimizers": []}
    for index, (model, state_dict) in enumerate(weights):
        written["models"].append(
            strategy.save_model_checkpoint(model, state_dict, folder, index, safe_serialization, is_writer)
        )
    for index, optimizer in enumerate(objects.optimizers):
        written["optimizers"].append(strategy.save_optimizer_checkpoint(optimizer, folder, index, is_writer))
    if is_writer:
        written.update({"schedulers": [], "dataloaders": [], "custom": []})
        for index, scheduler in enumerate(objects.schedulers):
            io_.save_object(scheduler.state_dict(), os.path.join(folder, scheduler_file(index)))
            written["schedulers"].append(scheduler_file(index))
        for index, loader in enumerate(objects.dataloaders):
            if hasattr(loader, "state_dict"):
                state = loader_state(loader) if loader_state is not None else loader.state_dict()
                io_.save_object(state, os.path.join(folder, dataloader_file(index)))
                written["dataloaders"].append(dataloader_file(index))
        scaler_state = objects.scaler.state_dict() if objects.scaler is not None else None
        if scaler_state is not None:
            io_.save_object(scaler_state, os.path.join(folder, SCALER_NAME))
            written["scaler"] = SCALER_NAME
        for index, obj in enumerate(objects.custom):
            io_.save_object(obj.state_dict(), os.path.join(folder, custom_file(index)))
            written["custom"].append(custom_file(index))
    io_.save_rng(os.path.join(folder, rng_file(process_index)))
    return written


def read_objects(
    folder: str,
    objects: TrainingObjects,
    strategy: Any,
    *,
    model_entries: Sequence[str],
    device: Any,
    optimizer_location: Any,
    process_index: int,
    strict: bool = True,
    distributed: bool = False,
) -> None:
    """Restore every object of ``objects`` from ``folder`` (never unpickling); called on every rank.

    Args:
        folder: the checkpoint folder.
        objects: what to restore (data loaders without ``load_state_dict`` are skipped).
        strategy: the strategy of the run (reads its own model and optimizer entries).
        model_entries: the folder entry of each model, in order.
        device: where model weights go.
        optimizer_location: ``map_location`` of optimizer states.
        process_index: this process's rank (its random-state file).
        strict: every model key must match.
        distributed: every process calls this on the same folder (the checks are shared out between them).
    """
    import torch.distributed as dist

    io_ = strategy.checkpoint_io
    grouped = distributed and dist.is_available() and dist.is_initialized()
    ranks = range(dist.get_world_size()) if grouped else [process_index]  # whose own files the run reads
    check_folder(folder, io_, distributed=distributed, ranks=ranks, entries=strategy.checkpoint_entries())
    check_model_shapes(folder, objects.models, model_entries, strategy)
    for model, entry in zip(objects.models, model_entries):
        strategy.load_model_checkpoint(model, folder, entry, device, strict=strict)
    for index, optimizer in enumerate(objects.optimizers):
        strategy.load_optimizer_checkpoint(optimizer, folder, index, map_location=optimizer_location)
    for index, scheduler in enumerate(objects.schedulers):
        scheduler.load_state_dict(io_.load_object(os.path.join(folder, scheduler_file(index))))
    loaders = [loader for loader in objects.dataloaders if hasattr(loader, "load_state_dict")]
    for index, loader in enumerate(loaders):
        path = os.path.join(folder, dataloader_file(index))
        if os.path.isfile(path):
            from accel_data.loaders import load_checkpoint_state  # position only with use_stateful_dataloader

            load_checkpoint_state(loader, io_.load_object(path))
    if objects.scaler is not None and objects.scaler.state_dict() is not None:
        objects.scaler.load_state_dict(io_.load_object(os.path.join(folder, SCALER_NAME)))
    for index, obj in enumerate(objects.custom):
        obj.load_state_dict(io_.load_object(os.path.join(folder, custom_file(index))))
    rng_path = os.path.join(folder, rng_file(process_index))
    if os.path.isfile(rng_path):
        io_.load_rng(rng_path)
    elif os.path.isfile(os.path.join(folder, f"{RNG_STATE_NAME}_{process_index}.pkl")):
        logger.warning(
            "%s holds random states as a pickle (written by another tool); accel does not unpickle "
            "checkpoints, so the random generators were not restored",
            folder,
        )
    else:
        why = "saved with another number of processes, or by the main process alone"
        logger.warning("no random states for process %d in %s (%s): generators unchanged", process_index, folder, why)


def _files_strategy() -> Any:
    """The single-device strategy's checkpoint entries, for the module-level functions (no Accelerator)."""
    from accel_train.strategies.base import Strategy

    return Strategy(None, None)  # type: ignore[arg-type]  # entries only: no device, no precision needed


# -- the documented module-level functions (for code that checkpoints without an Accelerator) ----------


def _model_entry(folder: str, index: int) -> str:
    for safe in (True, False):
        if os.path.isfile(os.path.join(folder, model_file(index, safe))):
            return model_file(index, safe)
    raise FileNotFoundError(f"{folder} holds no {model_file(index, True)} or {model_file(index, False)}")


def save_accelerator_state(
    output_dir: str | os.PathLike[str],
    model_states: list[dict[str, torch.Tensor]],
    optimizers: list[Any],
    schedulers: list[Any],
    dataloaders: list[Any],
    process_index: int,
    step: int | None = None,
    scaler: Any = None,
    save_on_each_node: bool = False,
    safe_serialization: bool = True,
) -> str:
    """Write models, optimizers, schedulers, loader positions, scaler and this process's random states
    into ``output_dir`` in the layout ``Accelerator.save_state`` uses (process 0 writes the shared files,
    or each machine's first process with ``save_on_each_node``); returns ``output_dir``.

    ``step`` is accepted for compatibility; accel keeps no step counter in the random-state file.
    """
    folder = os.fspath(output_dir)
    os.makedirs(folder, exist_ok=True)
    local_main = int(os.environ.get("LOCAL_RANK", process_index)) == 0
    objects = TrainingObjects(optimizers=optimizers, schedulers=schedulers, dataloaders=dataloaders, scaler=scaler)
    write_objects(
        folder,
        objects,
        _files_strategy(),
        weights=[(None, state) for state in model_states],
        is_writer=process_index == 0 or (save_on_each_node and local_main),
        process_index=process_index,
        safe_serialization=safe_serialization,
    )
    return folder


def load_accelerator_state(
    input_dir: str | os.PathLike[str],
    models: list[torch.nn.Module],
    optimizers: list[Any],
    schedulers: list[Any],
    dataloaders: list[Any],
    process_index: int,
    scaler: Any = None,
    map_location: Any = None,
    load_kwargs: dict[str, Any] | None = None,
    **load_model_func_kwargs: Any,
) -> dict[str, Any]:
    """Restore what `save_accelerator_state()` wrote into the given objects (never unpickling);
    returns the attributes to override on the caller (none are kept by accel: an empty dict)."""
    folder = os.fspath(input_dir)
    device = map_location if map_location not in (None, "on_device") else "cpu"
    read_objects(
        folder,
        TrainingObjects(models, optimizers, schedulers, dataloaders, scaler=scaler),
        _files_strategy(),
        model_entries=[_model_entry(folder, index) for index in range(len(models))],
        device=device,
        optimizer_location=(load_kwargs or {}).get("map_location", device),
        process_index=process_index,
        strict=load_model_func_kwargs.pop("strict", True),
    )
    return {}


def save_custom_state(obj: Any, path: str | os.PathLike[str], index: int = 0, save_on_each_node: bool = False) -> None:
    """Write ``obj.state_dict()`` to ``<path>/custom_checkpoint_<index>.pkl`` (the save_state layout).

    ``save_on_each_node`` is accepted for compatibility: the caller decides which process calls it.
    """
    from accel_train.checkpoint.file_io import CheckpointIO

    os.makedirs(os.fspath(path), exist_ok=True)
    CheckpointIO().save_object(obj.state_dict(), os.path.join(os.fspath(path), custom_file(index)))


def load_custom_state(obj: Any, path: str | os.PathLike[str], index: int = 0) -> None:
    """Restore ``obj`` from ``<path>/custom_checkpoint_<index>.pkl`` (never unpickling objects)."""
    from accel_train.checkpoint.file_io import CheckpointIO

    obj.load_state_dict(CheckpointIO().load_object(os.path.join(os.fspath(path), custom_file(index))))
