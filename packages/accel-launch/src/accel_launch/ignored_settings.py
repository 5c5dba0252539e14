"""Launch settings a run would drop without a word, found so that the launcher can say so.

The ``--parallelism_config_*`` flags only build a ``ParallelismConfig`` together with
``--use_parallelism_config`` (a config file's ``parallelism_config:`` section turns it on by itself).
Without it they are ignored, as in the documented system; `ignored_parallelism_settings()` words
the warning the plan carries (printed on stderr and shown by ``--dry_run``). No torch import here.
"""

from __future__ import annotations

from accel_launch.options import G_PARALLELISM, OPTIONS

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time: `accel --help` stays fast
    from collections.abc import Mapping
    from typing import Any

#: The launch options that only take effect with ``--use_parallelism_config``.
PARALLELISM_OPTIONS: tuple[str, ...] = tuple(option.dest for option in OPTIONS if option.group == G_PARALLELISM)


def _given(name: str, value: Any, source: str) -> str:
    if source.startswith("flag"):
        return f"--{name} {value}"
    return f"{name}: {value} ({source})"


def ignored_parallelism_settings(values: Mapping[str, Any], sources: Mapping[str, str]) -> str | None:
    """The warning for ``--parallelism_config_*`` settings a run ignores, or None when there are none.

    Only values the user set count (from a flag or a config file, not the defaults of the options
    table), and nothing is ignored once ``use_parallelism_config`` is on.

    Args:
        values: the resolved launch options (flag over config file over default).
        sources: where each value came from (``flag --x``, ``config file <path>``, ``default``, ...).

    Returns:
        One line naming the settings given and the missing ``--use_parallelism_config``, or None.
    """
    if values.get("use_parallelism_config"):
        return None
    given = [
        _given(name, values.get(name), sources[name])
        for name in PARALLELISM_OPTIONS
        if sources.get(name, "default") != "default"
    ]
    if not given:
        return None
    named = given[0] if len(given) == 1 else f"{', '.join(given[:-1])} and {given[-1]}"
    verb, them = ("is", "it") if len(given) == 1 else ("are", "them")
    return (
        f"{named} {verb} ignored without --use_parallelism_config: add --use_parallelism_config "
        f"to build a ParallelismConfig from {them}"
    )
