"""File formats of ``save_state`` checkpoints: reading and writing one file, never unpickling code.

========================  ==========================================================================
file                      format
========================  ==========================================================================
``model.safetensors``     safetensors (``model_{i}.safetensors`` for the i-th model, i > 0);
                          tensors sharing storage (tied weights) are stored once
``pytorch_model.bin``     ``torch.save`` zip (with ``safe_serialization=False``), read back with
                          ``torch.load(weights_only=True)``
``optimizer.bin``         ``torch.save`` zip of ``optimizer.state_dict()`` (``optimizer_{i}.bin``),
                          read with ``weights_only=True``: tensors, numbers, strings, lists, dicts only
``scheduler.bin``         same, for schedulers (``scheduler_{i}.bin``)
``dl_state_dict.bin``     same, for the position of each prepared data loader (``dl_state_dict_{i}.bin``)
``scaler.pt``             same, for the fp16 gradient scaler
``custom_checkpoint_{i}.pkl``  same, for objects given to ``register_for_checkpointing``
``random_states_{rank}.safetensors``  safetensors: torch/accelerator generator states as uint8 tensors,
                          Python's and NumPy's states as JSON in the header metadata (no pickle)
``accumulated_grads_{rank}.safetensors``  gradients gathered so far, when saved between two optimizer
                          steps of gradient accumulation (per process: under DDP they differ)
``accel_checkpoint.json``  JSON manifest: what the checkpoint holds, written last
========================  ==========================================================================

Each safetensors file a ``save_state`` writes carries the id of that save in its header metadata
(``accel_save_id``, `accel_train.checkpoint.save_id`), as the manifest does.

The names of the documented layout are kept (``random_states_{rank}`` gets the ``.safetensors``
suffix since it is no longer a pickle). A damaged file raises `CorruptCheckpointError`
(`accel_train.checkpoint.integrity`), one that would run code `UnsafeCheckpointError`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import re
import shutil
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from accel_state import imports
from accel_state.errors import UnsafeCheckpointError
from accel_train.checkpoint.save_id import with_save_id

logger = logging.getLogger(__name__)

MANIFEST_NAME = "accel_checkpoint.json"
FORMAT_VERSION = 1
RNG_FORMAT = "accel-rng-1"
#: The header entry of an RNG file holding torch_xla's generator seed (decimal text), on XLA runs.
XLA_RNG_KEY = "xla_manual_seed"


# -- tensors and plain state dicts ------------------------------------------------------------------


def save_torch(obj: Any, path: str) -> None:
    """``torch.save`` to ``path`` (a zip holding tensors and plain Python values)."""
    torch.save(obj, path)


def load_torch(path: str, map_location: Any = "cpu") -> Any:
    """``torch.load(weights_only=True)``: tensors and plain values only; any other pickle is refused
    (`UnsafeCheckpointError`), a damaged file named (`CorruptCheckpointError`).

    Args:
        path: the ``torch.save`` file.
        map_location: where tensors are placed, as in ``torch.load``.
    """
    from accel_train.checkpoint.integrity import torch_load_failure

    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as error:
        failure = torch_load_failure(path, error)
        if failure is error:
            raise
        raise failure from None


#: Device types whose tensors have no storage to compare (their state dicts are written from CPU copies,
#: which hold every name, tied or not).
_NO_STORAGE_DEVICES = ("meta", "xla")


def _shared_groups(state_dict: Mapping[str, torch.Tensor]) -> list[list[str]]:
    by_storage: dict[tuple[Any, int, int], list[str]] = {}
    for name, tensor in state_dict.items():
        if not isinstance(tensor, torch.Tensor) or tensor.device.type in _NO_STORAGE_DEVICES:
            continue
        key = (tensor.device, tensor.untyped_storage().data_ptr(), tensor.untyped_storage().nbytes())
        by_storage.setdefault(key, []).append(name)
    return [names for names in by_storage.values() if len(names) > 1]


def save_weights(state_dict: Mapping[str, Any], path: str, safe_serialization: bool = True) -> None:
    """Write a model state dict (safetensors, or ``torch.save`` when not ``safe_serialization``)."""
    if not safe_serialization:
        save_torch(dict(state_dict), path)
        return
    from safetensors.torch import save_file

    tensors = {name: t for name, t in state_dict.items() if isinstance(t, torch.Tensor)}
    others = sorted(set(state_dict) - set(tensors))
    if others:
        raise TypeError(f"cannot save non-tensor entries {others} of a model state dict with safetensors")
    aliases: dict[str, str] = {}
    for group in _shared_groups(tensors):
        # Same data, same view: one tensor tied under several names (stored once). Other views into the
        # same storage (a flat buffer, DDP gradient buckets) are copied out so each is stored on its own.
        by_view: dict[tuple[Any, ...], str] = {}
        for name in group:
            tensor = tensors[name]
            view = (tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype)
            if view in by_view:
                aliases[name] = by_view[view]
                del tensors[name]
            else:
                by_view[view] = name
        if len(by_view) > 1:
            for name in by_view.values():
                tensors[name] = tensors[name].clone()
    tensors = {name: t.detach().contiguous() if not t.is_contiguous() else t.detach() for name, t in tensors.items()}
    metadata = {"format": "pt"}
    if aliases:
        metadata["accel_aliases"] = json.dumps(aliases)
        logger.warning(
            "Removed shared tensor%s %s while saving %s (each is stored once, under %s); loading restores them "
            "as aliases. Check that reloading gives no warning about missing keys.",
            "s" if len(aliases) > 1 else "",
            sorted(aliases),
            path,
            sorted(set(aliases.values())),
        )
    save_file(tensors, path, metadata=with_save_id(metadata))


def save_shard(tensors: Mapping[str, torch.Tensor], path: str, metadata: Mapping[str, str]) -> None:
    """Write one process's tensors (a local shard) as safetensors, with ``metadata`` in its header (what the
    reader checks before using it: the number of processes that wrote it ...).

    Args:
        tensors: name -> tensor, each contiguous and on the CPU.
        path: the ``.safetensors`` file.
        metadata: string values recorded in the file's header.
    """
    from safetensors.torch import save_file

    with writing(path):
        save_file(dict(tensors), path, metadata=with_save_id({"format": "pt", **metadata}))


def read_shard(path: str) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """The header metadata and tensors of a file `save_shard()` wrote, its structure checked first.

    Raises:
        CorruptCheckpointError: the file is not a whole safetensors file.
    """
    from safetensors.torch import load_file

    from accel_bigmodel.tensor_io import check_safetensors_file

    _, metadata = check_safetensors_file(path)
    return dict(metadata), load_file(path)


def replace_file(path: str, write: Any) -> None:
    """Write a file atomically: ``write(tmp)`` writes ``path + ".partial"``, which then replaces ``path``;
    a failure leaves ``path`` as it was and removes the partial file.

    Args:
        path: the file to (re)place.
        write: a function of the temporary path that writes the whole file there.
    """
    tmp = f"{path}.partial"
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def save(
    obj: Any, f: str | os.PathLike[str], save_on_each_node: bool = False, safe_serialization: bool = False
) -> None:
    """Save ``obj`` to ``f`` from one process: the main one, or the local main one of every machine with
    ``save_on_each_node`` (``accel.utils.save``).

    With ``safe_serialization`` ``obj`` must be a dict of tensors, written with safetensors; tensors that
    share storage are stored once and their removal is logged. Otherwise ``torch.save`` is used.

    Args:
        obj: The object to save (a dict of tensors with ``safe_serialization``).
        f: Path of the file written.
        save_on_each_node: Whether the local main process of every machine writes, not only the main one.
            Defaults to `False`.
        safe_serialization: Whether to write safetensors instead of ``torch.save``. Defaults to `False`.
    """
    from accel_state.state import PartialState

    state = PartialState()
    writer = state.is_local_main_process if save_on_each_node else state.is_main_process
    if not writer:
        return
    path = os.fspath(f)
    if safe_serialization:
        if not isinstance(obj, Mapping):
            raise TypeError(f"save(safe_serialization=True) writes a dict of tensors, got {type(obj).__name__}")
        save_weights(dict(obj), path, safe_serialization=True)
    else:
        torch.save(obj, path)


def load(f: str | os.PathLike[str], map_location: Any = None, **kwargs: Any) -> Any:
    """Load what `save()` wrote (``accel.utils.load``): ``torch.load`` with ``weights_only=True`` unless
    ``weights_only=False`` is passed; a ``.safetensors`` file is read with safetensors.

    Args:
        f: Path of the file to read.
        map_location: Where tensors are placed, as in ``torch.load`` (`None`: where saved; `cpu` for safetensors).
            Defaults to `None`.
        **kwargs: Passed on to ``torch.load`` (``weights_only`` defaults to `True`).
    """
    path = os.fspath(f)
    if path.endswith(".safetensors"):
        return load_weights(path, map_location or "cpu")
    kwargs.setdefault("weights_only", True)
    return torch.load(path, map_location=map_location, **kwargs)


def load_weights(path: str, device: Any = "cpu") -> dict[str, torch.Tensor]:
    """Read a model state dict written by `save_weights()` (or a reference checkpoint); a damaged
    file raises `CorruptCheckpointError` before any tensor is read.

    Args:
        path: a ``.safetensors`` file, or a ``torch.save`` file (read as `load_torch()` does).
        device: where tensors are placed.
    """
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        from accel_bigmodel.tensor_io import check_safetensors_file

        _, metadata = check_safetensors_file(path)
        state = load_file(path, device=str(device))
        for alias, name in json.loads(metadata.get("accel_aliases", "{}")).items():
            state[alias] = state[name]
        return state
    return load_torch(path, map_location=device)


def load_into_model(
    model: torch.nn.Module, state_dict: dict[str, torch.Tensor], source: str, strict: bool = True
) -> None:
    """Load ``state_dict`` into ``model``; tied weights missing from the file are accepted."""
    if state_dict and all(key.startswith("module.") for key in state_dict):
        state_dict = {key[len("module.") :]: value for key, value in state_dict.items()}
    result = model.load_state_dict(state_dict, strict=False)
    if not strict:
        return
    own = model.state_dict()
    tied = {name for group in _shared_groups(own) for name in group}
    missing = [key for key in result.missing_keys if key not in tied]
    if missing or result.unexpected_keys:
        raise RuntimeError(
            f"Error(s) in loading state_dict for {type(model).__name__}: {source} does not match the model: "
            f"missing keys {missing}, unexpected keys {list(result.unexpected_keys)}"
        )


def accumulated_gradients(models: list[torch.nn.Module]) -> dict[str, torch.Tensor]:
    """``{"<model index>.<parameter>": grad}`` for every parameter holding a gradient."""
    grads: dict[str, torch.Tensor] = {}
    for index, model in enumerate(models):
        for name, param in model.named_parameters():
            if param.grad is not None:
                grads[f"{index}.{name}"] = param.grad.detach()
    return grads


def restore_gradients(models: list[torch.nn.Module], grads: dict[str, torch.Tensor] | None) -> None:
    """Put saved gradients back (and clear those not saved, as after ``zero_grad``)."""
    for index, model in enumerate(models):
        for name, param in model.named_parameters():
            saved = None if grads is None else grads.get(f"{index}.{name}")
            if saved is None:
                param.grad = None
            elif param.grad is not None and param.grad.shape == saved.shape:
                param.grad.copy_(saved)  # in place: DDP gradient-bucket views stay views
            else:
                param.grad = saved.to(device=param.device, dtype=param.dtype).clone()


# -- random number generators -------------------------------------------------------------------


def rng_states(
    extra_generators: Mapping[str, torch.Generator] | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Every generator's state: tensors for torch/accelerator states, JSON text for Python and NumPy."""
    tensors: dict[str, torch.Tensor] = {"torch_manual_seed": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for index, state in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"torch_cuda_manual_seed.{index}"] = state
    for device in ("xpu", "npu", "mlu", "musa", "hpu"):
        module = getattr(torch, device, None)
        checker = getattr(imports, f"is_{device}_available", None)
        if module is not None and checker is not None and checker() and hasattr(module, "get_rng_state_all"):
            for index, state in enumerate(module.get_rng_state_all()):
                tensors[f"torch_{device}_manual_seed.{index}"] = state
    for name, generator in (extra_generators or {}).items():
        tensors[f"generator.{name}"] = generator.get_state()
    version, internal, gauss = random.getstate()
    metadata = {"format": RNG_FORMAT, "random_state": json.dumps([version, list(internal), gauss])}
    xla_seed = _xla_rng_state()
    if xla_seed is not None:
        metadata[XLA_RNG_KEY] = str(xla_seed)  # a 64-bit unsigned seed: text, no tensor dtype holds it
    if imports.is_numpy_available():
        import numpy as np

        name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)  # type: ignore[misc]
        metadata["numpy_random_seed"] = json.dumps(
            [name, np.asarray(keys).tolist(), int(pos), int(has_gauss), float(cached)]
        )
    return tensors, metadata


def _xla_rng_state() -> int | None:
    """torch_xla's generator seed on this process's device, when the run is on XLA (else ``None``)."""
    from accel_state.xla_ops import on_xla

    if not on_xla():
        return None
    import torch_xla.core.xla_model as xm  # type: ignore[import-not-found]

    return int(xm.get_rng_state())


def _set_xla_rng_state(seed: int) -> None:
    """Give torch_xla's generator back its saved seed (a run not on XLA has no such generator: skipped)."""
    from accel_state.xla_ops import on_xla

    if not on_xla():
        return
    import torch_xla.core.xla_model as xm  # type: ignore[import-not-found]

    xm.set_rng_state(seed)


def save_rng(
    path: str,
    extra_generators: Mapping[str, torch.Generator] | None = None,
    states: tuple[dict[str, torch.Tensor], dict[str, str]] | None = None,
) -> None:
    """Write the generators' states: ``states`` when given (taken earlier by `rng_states()`, as an
    asynchronous save does when it is called), else the states they have now."""
    from safetensors.torch import save_file

    tensors, metadata = states if states is not None else rng_states(extra_generators)
    save_file({k: v.contiguous() for k, v in tensors.items()}, path, metadata=with_save_id(dict(metadata)))


def load_rng(path: str, extra_generators: Mapping[str, torch.Generator] | None = None) -> None:
    """Restore every generator saved by `save_rng()` (those absent here are skipped); a damaged file
    raises `CorruptCheckpointError` before any generator changes.

    Args:
        path: the ``random_states_{rank}.safetensors`` file.
        extra_generators: generators restored from the file's ``generator.<name>`` entries, by name.
    """
    from safetensors import safe_open

    from accel_train.checkpoint.integrity import check_rng_file

    check_rng_file(path, RNG_FORMAT)
    with safe_open(path, framework="pt") as handle:
        metadata = handle.metadata() or {}
        if metadata.get("format") != RNG_FORMAT:
            raise ValueError(f"{path} is not an accel RNG state file (format {metadata.get('format')!r})")
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118
    version, internal, gauss = json.loads(metadata["random_state"])
    random.setstate((version, tuple(internal), gauss))
    if "numpy_random_seed" in metadata and imports.is_numpy_available():
        import numpy as np

        name, keys, pos, has_gauss, cached = json.loads(metadata["numpy_random_seed"])
        np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(tensors["torch_manual_seed"])
    if XLA_RNG_KEY in metadata:
        _set_xla_rng_state(int(metadata[XLA_RNG_KEY]))
    cuda_states = sorted(
        (k for k in tensors if k.startswith("torch_cuda_manual_seed.")), key=lambda k: int(k.rsplit(".", 1)[1])
    )
    if cuda_states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([tensors[k] for k in cuda_states][: torch.cuda.device_count()])
    for name, generator in (extra_generators or {}).items():
        key = f"generator.{name}"
        if key in tensors:
            generator.set_state(tensors[key])


# -- manifest -----------------------------------------------------------------------------------


def write_manifest(folder: str, content: dict[str, Any]) -> None:
    path = os.path.join(folder, MANIFEST_NAME)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump({"format_version": FORMAT_VERSION, **content}, handle, indent=1, sort_keys=True)


def read_manifest(folder: str) -> dict[str, Any] | None:
    """The manifest of ``folder`` (``None`` when it has none); not JSON, or not the manifest's structure, it
    raises `CorruptCheckpointError`.

    Args:
        folder: the checkpoint folder.
    """
    from accel_train.checkpoint.manifest import read_manifest_file

    path = os.path.join(folder, MANIFEST_NAME)
    if not os.path.isfile(path):
        return None
    return read_manifest_file(path)


# -- the object strategies write through ---------------------------------------------------------------


class CheckpointIO:
    """Reads and writes one file of a checkpoint in the formats above; never unpickles code.

    Strategies decide *what* goes into a checkpoint (a full state dict on the writing process, or
    shards from every process); this object decides *how* a file is written and read. It is the one
    reader and writer of every backend's files: single files (weights, objects, RNG, JSON markers, the
    manifest), ``torch.distributed.checkpoint`` folders (FSDP / ND shards) and DeepSpeed engine
    checkpoints. The connector builds one per Accelerator and hands it to the strategy; a stricter or
    differently stored reader is a subclass given there.
    """

    #: Classes beyond tensors and plain values that this backend's ``torch.save`` files may hold (a backend
    #: whose own reader unpickles, DeepSpeed, lists the few types its files need; nothing else loads).
    allowed_globals: tuple[Any, ...] = ()

    def save_weights(self, state_dict: Mapping[str, Any], path: str, safe_serialization: bool = True) -> None:
        """Model weights as safetensors (tied tensors once) or a ``torch.save`` zip."""
        with writing(path):
            save_weights(state_dict, path, safe_serialization)

    def load_weights(self, path: str, device: Any = "cpu") -> dict[str, torch.Tensor]:
        return load_weights(path, device)

    def load_into_model(self, model: torch.nn.Module, state_dict: dict[str, Any], path: str, strict: bool) -> None:
        """Load ``state_dict`` into ``model``, every missing or unexpected key named."""
        load_into_model(model, state_dict, path, strict=strict)

    def save_object(self, obj: Any, path: str) -> None:
        """A state dict of plain values and tensors (optimizer, scheduler, loader, scaler ...)."""
        with writing(path):
            save_torch(obj, path)

    def load_object(self, path: str, map_location: Any = "cpu") -> Any:
        return load_torch(path, map_location=map_location)

    def save_rng(self, path: str, states: tuple[dict[str, torch.Tensor], dict[str, str]] | None = None) -> None:
        """This process's random-number-generator states (tensors and JSON, no pickle): ``states`` when
        given (taken by `rng_states()` when an asynchronous save was called), else the current ones."""
        with writing(path):
            save_rng(path, states=states)

    def load_rng(self, path: str) -> None:
        load_rng(path)

    def save_json(self, obj: Any, path: str) -> None:
        """A small JSON file (markers, manifests)."""
        with writing(path), open(path, "w", encoding="utf-8") as handle:
            json.dump(obj, handle)

    def save_engine(self, engine: Any, folder: str, tag: str) -> None:
        """A DeepSpeed engine's own checkpoint (model, optimizer partitions, engine scheduler) in ``folder/tag``.

        Collective: every rank writes its partitions. DeepSpeed's own layout is kept, so its tools
        (``zero_to_fp32.py``) read it.
        """
        own = engine.checkpoint_engine
        engine.checkpoint_engine = _WritingCheckpointEngine(own)
        copy_scripts = getattr(engine, "_copy_recovery_script", None)  # rank 0 copies zero_to_fp32.py in
        if copy_scripts is not None:

            def copy_scripts_writing(save_path: str) -> None:
                with writing(save_path):
                    copy_scripts(save_path)

            engine._copy_recovery_script = copy_scripts_writing
        try:
            engine.save_checkpoint(folder, tag=tag, client_state={}, save_latest=False)
        finally:
            engine.checkpoint_engine = own
            if copy_scripts is not None:
                del engine._copy_recovery_script  # the class's own method again

    def load_engine(self, engine: Any, folder: str, tag: str, strict: bool = True) -> None:
        """Read ``folder/tag`` (written by `save_engine()`) into the engine, optimizer and scheduler included."""
        path, _ = engine.load_checkpoint(
            folder,
            tag=tag,
            load_module_strict=strict,
            load_optimizer_states=engine.optimizer is not None,
            load_lr_scheduler_states=engine.lr_scheduler is not None,
        )
        if path is None:
            raise FileNotFoundError(f"DeepSpeed found no checkpoint {tag!r} in {folder}")

    def write_manifest(self, folder: str, content: dict[str, Any]) -> None:
        """The checkpoint's manifest (``accel_checkpoint.json``), written last."""
        with writing(os.path.join(folder, MANIFEST_NAME)):
            write_manifest(folder, content)

    def read_manifest(self, folder: str) -> dict[str, Any] | None:
        """The manifest of ``folder`` (``None`` for a folder written by another tool)."""
        return read_manifest(folder)

    # -- sharded (torch.distributed.checkpoint) folders: every rank takes part ------------------------

    def save_sharded(self, state: dict[str, Any], folder: str) -> None:
        """Write this rank's shards of ``state`` into the DCP folder ``folder`` (collective: on the default
        group, or in an asynchronous save's background on its own group, `background.side_group()`)."""
        import torch.distributed.checkpoint as dcp

        from accel_train.checkpoint.background import side_group

        with writing(folder):
            os.makedirs(folder, exist_ok=True)
            group = side_group()
            if group is None:
                dcp.save(state, checkpoint_id=folder)
            else:
                dcp.save(state, checkpoint_id=folder, process_group=group)

    def sharded_metadata(self, folder: str) -> Any:
        """The ``Metadata`` of the DCP folder ``folder`` (tensor names and global shapes), unpickled with
        the allow-list of DCP's own classes."""
        from accel_train.checkpoint.safety import read_dcp_metadata

        return read_dcp_metadata(os.path.join(folder, ".metadata"))

    def load_sharded(
        self, state: dict[str, Any], folder: str, planner: Any = None, flatten_sharded_tensors: bool = True
    ) -> None:
        """Read the DCP folder ``folder`` into ``state`` in place, resharded to this run (collective).

        The metadata is read with an allow-list and non-tensor items with ``weights_only=True`` (torch's
        own reader unpickles both); ``planner`` (a ``DefaultLoadPlanner``) only gives its options.
        """
        import torch.distributed.checkpoint as dcp

        from accel_train.checkpoint.safety import SafeFileSystemReader, SafeLoadPlanner

        options = {"flatten_sharded_tensors": flatten_sharded_tensors}
        if planner is not None:
            for name in ("flatten_state_dict", "flatten_sharded_tensors", "allow_partial_load"):
                if hasattr(planner, name):
                    options[name] = getattr(planner, name)
        dcp.load(state, storage_reader=SafeFileSystemReader(folder), planner=SafeLoadPlanner(**options))

    def load_sharded_whole(self, folder: str) -> dict[str, Any]:
        """Every tensor of the DCP folder ``folder``, read whole on this one process (no process group).

        The folder is checked first (`check_sharded()`), then read with the allow-list reader and a
        planner that unpickles with ``weights_only=True``: nothing in it runs.
        """
        from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

        from accel_train.checkpoint.safety import SafeFileSystemReader, safe_empty_planner

        self.check_sharded(folder)
        state_dict: dict[str, Any] = {}
        _load_state_dict(
            state_dict, storage_reader=SafeFileSystemReader(folder), planner=safe_empty_planner(), no_dist=True
        )
        return state_dict

    # -- checks before anything is loaded ----------------------------------------------------------------

    def check_file(self, path: str) -> None:
        """Refuse a ``torch.save`` file whose pickle names anything but tensors, plain values and
        `allowed_globals` (`UnsafeCheckpointError`), or that is damaged
        (`CorruptCheckpointError`); reads no tensor data.

        Args:
            path: the file.
        """
        from accel_train.checkpoint.safety import check_torch_file

        check_torch_file(path, self.allowed_globals)

    def check_sharded(self, folder: str) -> None:
        """Refuse a DCP folder whose metadata or any item would run code, or whose files are missing."""
        for _, check in self.sharded_checks(folder):
            check()

    def sharded_checks(self, folder: str, verified: set[bytes] | None = None) -> list[tuple[str, Any]]:
        """The checks of a DCP folder, one per item, as ``(label, check)`` (see
        `dcp_folder_checks()`); its ``.metadata`` is read and checked
        here, so a refused metadata, a missing or a short data file raises at once.

        Args:
            folder: the DCP folder.
            verified: item pickles already checked, shared between folders (a new set when not given).
        """
        from accel_train.checkpoint.safety import dcp_folder_checks

        return dcp_folder_checks(folder, verified)


def _partial_folder(path: str) -> str | None:
    """The ``.<name>.partial`` folder of a save that ``path`` lies in, if any."""
    current = os.path.abspath(path)
    while True:
        name = os.path.basename(current)
        if name.startswith(".") and name.endswith(".partial"):
            return current
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent


@contextlib.contextmanager
def writing(path: str) -> Iterator[None]:
    """Turn any failure while writing ``path`` into an ``OSError`` naming it and the OS reason (disk full,
    permission denied, file too large).

    Inside a save of every process (`accel_train.checkpoint.outcome.collecting`) the failure is recorded
    and the block ends quietly: the process goes on through the save's collectives, and the save raises
    the same error on every rank once they have compared outcomes, removing its partial folder. Outside
    one, it is raised at once and the partial folder of the save ``path`` lies in is removed: the previous
    checkpoint was never touched and nothing half-written stays behind."""
    from accel_train.checkpoint import outcome

    try:
        yield
    except (TypeError, KeyError, AttributeError, UnsafeCheckpointError):
        raise  # what is written is wrong, not where: not an I/O error
    except BaseException as error:  # torch.distributed.checkpoint's CheckpointException is a BaseException
        if isinstance(error, (KeyboardInterrupt, SystemExit, GeneratorExit)):
            raise
        failure = write_error(path, error)
        failure.__cause__ = error
        failures = outcome.current()
        if failures is not None:
            failures.record(failure)
            return
        partial = _partial_folder(path)
        if partial is not None:
            shutil.rmtree(partial, ignore_errors=True)
        raise failure from error


class _WritingCheckpointEngine:
    """DeepSpeed's checkpoint engine with each of its writes under `writing()`: during a save a failed
    write is recorded rather than raised, so this rank still reaches DeepSpeed's closing barrier and no
    rank is left waiting there; the save then raises it on every rank, naming the file and the reason."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def save(self, state_dict: Any, path: str) -> None:
        with writing(path):
            self._inner.save(state_dict, path)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        with writing(path):
            self._inner.makedirs(path, exist_ok=exist_ok)


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
