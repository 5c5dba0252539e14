"""The optimizer state a pipeline stage writes into, and reads from, the DCP folder the stages share.

Every stage holds the same parameter groups of the user's optimizer, each with the stage's own
parameters. In one ``torch.distributed.checkpoint`` folder the groups of all stages land under the
same keys (``param_groups.<i>.<setting>``), and DCP keeps one process's copy of such an item. Their
hyper-parameters (``lr``, ``betas`` ...) are the same on every stage, so they are written once, without
the parameter names that differ between stages; on load each stage puts its own parameter names back.
Written this way the groups do not depend on where the model was split.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["GROUPS_KEY", "check_saved_groups", "stage_groups_for_checkpoint", "stage_groups_from_checkpoint"]

#: The key of the parameter groups in an optimizer state dict (torch's name).
GROUPS_KEY = "param_groups"
#: The key of a group's parameter names (torch's name), which differs between stages.
_PARAMS_KEY = "params"


def stage_groups_for_checkpoint(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` (an optimizer state dict keyed by parameter name) with each group's hyper-parameters
    only: the same on every stage, so the stages agree on every group item they write."""
    groups = [{key: value for key, value in group.items() if key != _PARAMS_KEY} for group in state[GROUPS_KEY]]
    return {**state, GROUPS_KEY: groups}


def stage_groups_from_checkpoint(loaded: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
    """The state dict to hand to the optimizer: ``loaded`` (read from the checkpoint into the form
    `stage_groups_for_checkpoint()` gives) with each group's parameter names taken from ``current``,
    this stage's own state dict, and any setting the checkpoint lacks kept from ``current``."""
    groups = [
        {**now, **{key: value for key, value in saved.items() if key != _PARAMS_KEY}, _PARAMS_KEY: now[_PARAMS_KEY]}
        for saved, now in zip(loaded[GROUPS_KEY], current[GROUPS_KEY])
    ]
    return {**loaded, GROUPS_KEY: groups}


def saved_group_settings(metadata: Any) -> dict[int, set[str]]:
    """``{group index: settings}`` written for the optimizer's parameter groups in a DCP ``Metadata``."""
    pattern = re.compile(rf"^{GROUPS_KEY}\.(\d+)\.([^.]+)$")
    found: dict[int, set[str]] = {}
    for key in getattr(metadata, "state_dict_metadata", {}) or {}:
        match = pattern.match(key)
        if match:
            found.setdefault(int(match.group(1)), set()).add(match.group(2))
    return found


def check_saved_groups(metadata: Any, state: dict[str, Any], path: str) -> dict[str, Any]:
    """``state`` (in the form `stage_groups_for_checkpoint()` gives) cut to the group settings the
    checkpoint holds, after checking it holds as many groups as this optimizer has.

    A setting this optimizer has and the checkpoint lacks (one that a newer torch added) keeps its
    current value; one the checkpoint has and this optimizer lacks is not read.

    Args:
        metadata: the ``Metadata`` of the optimizer's DCP folder.
        state: this stage's optimizer state dict, groups without parameter names.
        path: the folder, named in the error.

    Raises:
        ValueError: the checkpoint holds another number of parameter groups than the optimizer.
    """
    saved = saved_group_settings(metadata)
    groups = state[GROUPS_KEY]
    if sorted(saved) != list(range(len(groups))):
        raise ValueError(
            f"the optimizer checkpoint {path} holds {len(saved)} parameter group(s) but this optimizer has "
            f"{len(groups)}: build the optimizer with the same parameter groups as the run that saved it"
        )
    cut = [{key: value for key, value in group.items() if key in saved[i]} for i, group in enumerate(groups)]
    return {**state, GROUPS_KEY: cut}
