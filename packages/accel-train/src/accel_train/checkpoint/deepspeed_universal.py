"""Loading a DeepSpeed ZeRO checkpoint written by another number of data-parallel processes.

DeepSpeed's partitioned optimizer files (``zero_pp_rank_{r}_mp_rank_00_optim_states.pt``) load only on the
number of processes that wrote them. DeepSpeed's own answer is its *universal* checkpoint: one folder per
parameter with the full fp32 weight and optimizer moments (``zero/<name>/fp32.pt``, ``exp_avg.pt``,
``exp_avg_sq.pt``, ``step.pt``), which an engine with ``checkpoint.load_universal`` repartitions to its own
processes. accel converts on the fly with ``deepspeed.checkpoint.ds_to_universal``:

1. The checkpoint's files were checked with the allow-list before this runs (``checkpointing.check_folder``):
   DeepSpeed's converter reads them with ``torch.load(weights_only=False)``.
2. The main process converts into ``.<checkpoint>.universal.partial`` next to the checkpoint folder (the
   checkpoint itself is never written to) and renames it to ``.<checkpoint>.universal`` once complete.
3. Every file of the converted folder is checked with the same allow-list, on every process, before the
   engine reads it.
4. The engine loads it with ``load_universal`` switched on for that one call; the folder is removed after.
   The module's buffers, which the universal load leaves alone, come from the checkpoint's model states
   (read with ``weights_only=True`` and the allow-list).

The checkpoint on disk keeps DeepSpeed's own layout; nothing is converted when the process counts match.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["load_resharded", "saved_world_size", "universal_dir"]

_PARTITION_RE = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_\d+_optim_states\.pt$")
_MODEL_STATES_RE = re.compile(r"^(?:mp_rank_00|zero_pp_rank_0_mp_rank_00)_model_states\.pt$")


def saved_world_size(tag_dir: str) -> int | None:
    """The number of data-parallel processes whose ZeRO optimizer partitions ``tag_dir`` holds.

    Args:
        tag_dir: the engine's checkpoint folder (``pytorch_model``).

    Returns:
        The number of partitions, or ``None`` when the folder holds none (no optimizer was saved).
    """
    if not os.path.isdir(tag_dir):
        return None
    ranks = {int(m.group(1)) for m in map(_PARTITION_RE.match, os.listdir(tag_dir)) if m}
    return len(ranks) or None


def universal_dir(checkpoint_folder: str) -> str:
    """The hidden folder, next to ``checkpoint_folder``, that holds its universal conversion while it loads.

    Args:
        checkpoint_folder: the ``save_state`` folder (holds the engine's tag folder).
    """
    parent, name = os.path.split(os.path.abspath(checkpoint_folder))
    return os.path.join(parent, f".{name}.universal")


def _convert(tag_dir: str, output_tag_dir: str) -> None:
    """Run DeepSpeed's converter on ``tag_dir`` into ``output_tag_dir`` (in this process, no worker pool)."""
    from argparse import Namespace

    from deepspeed.checkpoint import ds_to_universal

    args = Namespace(
        input_folder=tag_dir,
        output_folder=output_tag_dir,
        num_extract_workers=1,
        num_merge_workers=1,
        keep_temp_folder=False,
        strict=True,
        inject_missing_state=True,  # engines without pipeline / tensor parallelism do not write it
    )
    with contextlib.redirect_stdout(io.StringIO()), _quiet_progress():
        ds_to_universal.main(args)


@contextlib.contextmanager
def _quiet_progress() -> Iterator[None]:
    """The converter's progress bars off (one per parameter, on stderr)."""
    try:
        from deepspeed.checkpoint import ds_to_universal
    except ImportError:  # pragma: no cover - DeepSpeed is there when this runs
        yield
        return
    original = ds_to_universal.tqdm.tqdm
    ds_to_universal.tqdm.tqdm = lambda iterable, *args, **kwargs: iterable
    try:
        yield
    finally:
        ds_to_universal.tqdm.tqdm = original


def _prepare(checkpoint_folder: str, tag: str) -> str:
    """Convert ``checkpoint_folder/tag`` into the universal folder (main process); returns that folder.

    The converter reads every file of the engine folder, which ``check_folder`` checked; a DCP
    ``.metadata`` planted there is refused here as well (by name), so this never depends on that check alone.
    """
    from accel_train.checkpoint.layout import engine_torch_files

    engine_torch_files(os.path.join(checkpoint_folder, tag))
    target = universal_dir(checkpoint_folder)
    partial = f"{target}.partial"
    for leftover in (partial, target):  # a load killed earlier
        if os.path.exists(leftover):
            shutil.rmtree(leftover)
    try:
        os.makedirs(partial)
        _convert(os.path.join(checkpoint_folder, tag), os.path.join(partial, tag))
        os.rename(partial, target)
    except OSError as error:
        shutil.rmtree(partial, ignore_errors=True)
        raise OSError(
            error.errno,
            f"could not convert the DeepSpeed checkpoint {checkpoint_folder} to another number of processes in "
            f"{partial} ({error.strerror or error}); the folder next to the checkpoint must be writable, or "
            "convert it beforehand with DeepSpeed's ds_to_universal.py and resume on the same number",
        ) from error
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return target


def _load_buffers(module: Any, tag_dir: str, allowed: tuple[Any, ...]) -> None:
    """The module's buffers (running statistics ...) from the checkpoint's model states: DeepSpeed's universal
    load restores parameters only. Read with ``weights_only=True`` and the allow-list."""
    import torch

    buffers = dict(module.named_buffers())
    if not buffers:
        return
    names = sorted(n for n in os.listdir(tag_dir) if _MODEL_STATES_RE.match(n))
    if not names:
        return
    with torch.serialization.safe_globals(list(allowed)):
        saved = torch.load(os.path.join(tag_dir, names[0]), map_location="cpu", weights_only=True)
    state = saved.get("module") or {}
    with torch.no_grad():
        for name, buffer in buffers.items():
            if name in state and state[name] is not None:
                buffer.copy_(state[name].to(buffer.device, buffer.dtype))


def _agree(ok: bool) -> bool:
    """Whether every process reports ``ok`` (a collective; ``ok`` alone without a process group)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return ok
    flag = torch.tensor([0 if ok else 1], dtype=torch.int64)
    if dist.get_backend() == "nccl":  # pragma: no cover - CUDA only
        flag = flag.cuda()
    dist.all_reduce(flag)
    return int(flag.item()) == 0


def load_resharded(
    engine: Any,
    checkpoint_folder: str,
    tag: str,
    check_file: Callable[[str], None],
    allowed: tuple[Any, ...],
    load_engine: Callable[..., None],
    *,
    is_main_process: bool,
    strict: bool = True,
) -> None:
    """Load ``checkpoint_folder/tag``, written by another number of processes, into ``engine`` (collective).

    Args:
        engine: the ``DeepSpeedEngine`` to load into (its optimizer partitions are rebuilt for this run).
        checkpoint_folder: the ``save_state`` folder; its files were checked with the allow-list already.
        tag: the engine's folder inside it (``pytorch_model``).
        check_file: refuses a ``torch.save`` file that names a global outside the allow-list.
        allowed: the DeepSpeed types of that allow-list (the module's buffers are read with them).
        load_engine: reads a checked engine folder into the engine,
            ``load_engine(engine, folder, tag, strict=...)`` (``CheckpointIO.load_engine``).
        is_main_process: whether this process converts (one per run; the folder is shared).
        strict: every model key must match.

    Raises:
        OSError: the conversion folder next to the checkpoint cannot be written (named, with the reason).
        RuntimeError: the conversion failed on the main process (seen from the other processes).
        UnsafeCheckpointError: a converted file names a global outside the allow-list.
    """
    target = universal_dir(checkpoint_folder)
    error: BaseException | None = None
    if is_main_process:
        try:
            _prepare(checkpoint_folder, tag)
        except BaseException as raised:  # reported to the other processes before raising here
            error = raised
    if not _agree(error is None):
        if error is not None:
            raise error
        raise RuntimeError(
            f"converting the DeepSpeed checkpoint {checkpoint_folder} to this number of processes failed on the "
            "main process (its error says why)"
        )
    try:
        for root, dirs, files in os.walk(target):
            dirs.sort()
            for name in sorted(files):
                if name.endswith(".pt"):
                    check_file(os.path.join(root, name))
        config = engine._config
        previous = config.load_universal_checkpoint
        config.load_universal_checkpoint = True
        try:
            load_engine(engine, target, tag, strict=strict)
        finally:
            config.load_universal_checkpoint = previous
        _load_buffers(engine.module, os.path.join(checkpoint_folder, tag), allowed)
    finally:
        _agree(True)  # every process has read the converted files
        if is_main_process:
            shutil.rmtree(target, ignore_errors=True)
