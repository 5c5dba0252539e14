"""Short argument errors for the ``accel`` command: one usage line, the error, a hint at ``-h``.

argparse prints the whole usage (about 120 lines for ``accel launch``) before its error; the parsers
of ``accel`` (`accel_launch.launch_args.AccelArgumentParser`) print `error_text()` instead,
and an unknown option comes with the closest known ones (`suggest_options()`), torchrun's names
mapped to accel's. Imported only when an error is reported, so help and parsing stay cheap.
"""

from __future__ import annotations

import argparse

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time: `accel --help` stays fast
    from collections.abc import Iterable

#: torchrun's (``torch.distributed.run``) flag names -> the ``accel launch`` flag that means the same.
TORCHRUN_NAMES: dict[str, str] = {
    "nproc_per_node": "num_processes",
    "nnodes": "num_machines",
    "node_rank": "machine_rank",
    "master_addr": "main_process_ip",
    "master_port": "main_process_port",
}


def _normal(option: str) -> str:
    """``--Num-Processes=4`` -> ``num_processes``: the name compared when looking for a close option."""
    return option.split("=", 1)[0].lstrip("-").replace("-", "_").lower()


def known_options(parser: argparse.ArgumentParser) -> dict[str, str]:
    """The option names ``parser`` accepts, normalized (``num_processes``) -> the flag to show (``--num_processes``).

    Args:
        parser: the parser whose optional arguments are looked at.

    Returns:
        Each spelling of each option (kebab-case aliases and older names too), mapped to the first
        long flag of its argument, so a suggestion shows one spelling.
    """
    out: dict[str, str] = {}
    for action in parser._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS:
            continue
        long_flags = [flag for flag in action.option_strings if flag.startswith("--")]
        shown = long_flags[0] if long_flags else action.option_strings[0]
        for flag in action.option_strings:
            out.setdefault(_normal(flag), shown)
    return out


def suggest_options(unknown: str, parser: argparse.ArgumentParser, limit: int = 3) -> list[str]:
    """The known flags of ``parser`` closest to the unknown option ``unknown`` (best first; may be empty).

    A torchrun name (``--nproc_per_node``, ``--nnodes``, ``--node_rank``, ``--master_addr``,
    ``--master_port``) gives the ``accel launch`` flag that means the same, when ``parser`` has it.

    Args:
        unknown: the option as typed (``--num_processs``, ``--nproc-per-node=4``).
        parser: the parser that did not know it.
        limit: the most suggestions returned.

    Returns:
        Flags as ``parser`` spells them (``--num_processes``).
    """
    import difflib

    if not unknown.startswith("-"):
        return []
    known = known_options(parser)
    name = _normal(unknown)
    out: list[str] = []
    mapped = TORCHRUN_NAMES.get(name)
    if mapped is not None and mapped in known:
        out.append(known[mapped])
    for match in difflib.get_close_matches(name, list(known), n=limit + 3, cutoff=0.75):
        if known[match] not in out:
            out.append(known[match])
    return out[:limit]


def _one_of(flags: list[str]) -> str:
    return flags[0] if len(flags) == 1 else f"{', '.join(flags[:-1])} or {flags[-1]}"


def unrecognized_message(extras: Iterable[str], parser: argparse.ArgumentParser) -> str:
    """argparse's ``unrecognized arguments`` error, each unknown option followed by the close known ones.

    Args:
        extras: the arguments ``parser`` did not recognize.
        parser: the parser that did not recognize them (its options are the candidates).

    Returns:
        One line, e.g. ``unrecognized arguments: --nproc_per_node (did you mean --num_processes?
        --nproc_per_node is torchrun's name)``.
    """
    words = []
    for extra in extras:
        suggestions = suggest_options(extra, parser)
        if not suggestions:
            words.append(extra)
            continue
        note = f"{extra} (did you mean {_one_of(suggestions)}?"
        if _normal(extra) in TORCHRUN_NAMES:
            note += f" {extra.split('=', 1)[0]} is torchrun's name"
        words.append(note + ")")
    return "unrecognized arguments: " + " ".join(words)


def _positional(action: argparse.Action) -> str | None:
    if action.help == argparse.SUPPRESS:
        return None
    if isinstance(action.metavar, tuple):
        name = " ".join(action.metavar)
    elif action.metavar is not None:
        name = action.metavar
    elif action.choices and action.dest == argparse.SUPPRESS:
        name = "{" + ",".join(map(str, action.choices)) + "}"
    else:
        name = action.dest
    nargs = action.nargs
    if nargs is None:
        return name
    if nargs == argparse.OPTIONAL:
        return f"[{name}]"
    if nargs in (argparse.ZERO_OR_MORE, argparse.REMAINDER):
        return f"[{name} ...]"
    if nargs == argparse.ONE_OR_MORE:
        return f"{name} [{name} ...]"
    if nargs == argparse.PARSER:
        return f"{name} ..."
    if isinstance(nargs, int):
        return " ".join([name] * nargs)
    return name


def short_usage(parser: argparse.ArgumentParser) -> str:
    """One usage line of ``parser``: its command, ``[-h]``, ``[options]`` and its positional arguments.

    Args:
        parser: the parser described; an explicit one-line ``usage`` of its own is used as it is.

    Returns:
        ``usage: accel launch [-h] [options] training_script [training_script_args ...]``.
    """
    if parser.usage and "\n" not in parser.usage:
        return f"usage: {parser.usage % {'prog': parser.prog}}"
    words = [parser.prog]
    optionals = [action for action in parser._actions if action.option_strings]
    if any(isinstance(action, argparse._HelpAction) for action in optionals):
        words.append("[-h]")
    if any(not isinstance(action, argparse._HelpAction) for action in optionals):
        words.append("[options]")
    for action in parser._actions:
        if not action.option_strings:
            word = _positional(action)
            if word:
                words.append(word)
    return "usage: " + " ".join(words)


def error_text(parser: argparse.ArgumentParser, message: str) -> str:
    """What an argument error of ``parser`` prints: the short usage, the error, a hint at ``-h``.

    Args:
        parser: the parser that met the error.
        message: argparse's error message.

    Returns:
        Three lines, the last ending in a newline.
    """
    return f"{short_usage(parser)}\n{parser.prog}: error: {message}\nRun `{parser.prog} -h` to see every option.\n"
