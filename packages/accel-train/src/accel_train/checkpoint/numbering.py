"""Automatic checkpoint naming: ``project_dir/checkpoints/checkpoint_<n>``, and which ``n`` a save takes.

The documented system advances the number (``ProjectConfiguration.iteration``) on each save only and
never on a load. Where its save would lose data, accel stops instead, before anything is written or
removed, with an error that says what to set:

- ``checkpoint_<n>`` already exists (the documented system stops too when no ``total_limit`` is set;
  with one, it first deletes the oldest checkpoint, then writes a new ``checkpoint_0`` in its place);
- a newer ``checkpoint_<m>`` (``m > n``) exists: ``load_state()`` would go on taking ``checkpoint_<m>``
  and ``total_limit`` would remove the new, lower-numbered checkpoint first.

``continue_numbering_on_load`` (accel's opt-in) is the other way out: loading ``checkpoint_<n>`` raises
the number to at least ``n + 1``.
"""

from __future__ import annotations

import os
import re

__all__ = ["checkpoint_number", "continued_iteration", "list_checkpoints", "next_checkpoint_dir"]

#: The name of an automatic checkpoint folder; the group is its number.
CHECKPOINT_NAME = re.compile(r"^checkpoint_(\d+)$")


def checkpoint_number(path: str | os.PathLike) -> int | None:
    """The ``n`` of a folder named ``checkpoint_<n>``, or `None` for any other name.

    Args:
        path: a folder path (only its last component is read).

    Returns:
        The checkpoint's number, or `None` when the name is not an automatic checkpoint's.
    """
    match = CHECKPOINT_NAME.match(os.path.basename(os.path.normpath(os.fspath(path))))
    return int(match.group(1)) if match else None


def list_checkpoints(base: str) -> list[tuple[int, str]]:
    """Complete automatic checkpoints under ``base`` as ``(number, path)``, oldest first.

    Args:
        base: the ``checkpoints`` folder of a project (missing: no checkpoints).

    Returns:
        ``(number, path)`` of each ``checkpoint_<n>`` folder; hidden partial folders are not listed.
    """
    if not os.path.isdir(base):
        return []
    found = []
    for entry in os.listdir(base):
        number = checkpoint_number(entry)
        if number is not None and os.path.isdir(os.path.join(base, entry)):
            found.append((number, os.path.join(base, entry)))
    return sorted(found)


def next_checkpoint_dir(base: str, iteration: int) -> str:
    """The folder the next automatic save writes: ``base/checkpoint_<iteration>``, checked first.

    Args:
        base: the ``checkpoints`` folder of the project.
        iteration: ``ProjectConfiguration.iteration``, the number of the next checkpoint.

    Returns:
        The path of ``checkpoint_<iteration>``.

    Raises:
        ValueError: if that folder exists, or a checkpoint with a higher number does; the message gives
            the number to set (one past the newest) and the opt-in.
    """
    output_dir = os.path.join(base, f"checkpoint_{iteration}")
    found = list_checkpoints(base)
    newest = found[-1] if found else None
    if os.path.exists(output_dir):
        problem = f"Checkpoint directory {output_dir} ({iteration}) already exists"
    elif newest is not None and newest[0] > iteration:
        problem = (
            f"Checkpoint directory {output_dir} ({iteration}) would be older than the newest checkpoint "
            f"{newest[1]}: load_state() would keep taking that one, and total_limit removes the lowest numbers first"
        )
    else:
        return output_dir
    next_free = newest[0] + 1 if newest is not None else iteration + 1
    raise ValueError(
        f"{problem}; nothing was written or removed. As in the documented system, load_state() does not change "
        f"the number of the next save: set `accelerator.project_configuration.iteration = {next_free}` (one past "
        "the newest checkpoint), or create the ProjectConfiguration with continue_numbering_on_load=True so that "
        "load_state() of checkpoint_<n> makes the next save checkpoint_<n+1>"
    )


def continued_iteration(iteration: int, loaded: str | os.PathLike) -> int:
    """``iteration`` after loading ``loaded`` with ``continue_numbering_on_load``: at least ``n + 1`` for a
    folder named ``checkpoint_<n>`` (never lower than before), unchanged for any other name.

    Args:
        iteration: the number of the next checkpoint before the load.
        loaded: the folder that was loaded.

    Returns:
        The number of the next checkpoint after the load.
    """
    number = checkpoint_number(loaded)
    return iteration if number is None else max(iteration, number + 1)
