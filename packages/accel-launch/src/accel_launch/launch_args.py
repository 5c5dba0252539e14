"""The argument parser of ``accel launch``, built from the option table (no torch import).

Every flag has its snake_case name and a kebab-case alias (``--num_processes`` / ``--num-processes``).
A flag not given on the command line parses to ``None`` (a boolean switch to ``False``, as in the
documented system), so the config file can fill it in: flags win over the file, the file wins over the
defaults.
"""

from __future__ import annotations

import argparse

from accel_launch.options import OPTIONS, Option
from accel_state.enums import DynamoBackend

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time: `accel --help` stays fast
    from typing import Any, NoReturn

DESCRIPTION = "Launch a script on one or several processes and machines, with the settings of the config file."

#: torch.compile backends, lower-case as the config file and flags spell them ("no" disables it).
_DYNAMO_CHOICES = tuple(backend.lower() for backend in DynamoBackend.list())


def help_formatter(prog: str) -> argparse.HelpFormatter:
    """argparse's formatter with the terminal width found without importing shutil (faster help)."""
    import os

    try:
        width = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        try:
            width = os.get_terminal_size().columns
        except OSError:
            width = 80
    return argparse.HelpFormatter(prog, width=max(width - 2, 40))


#: Namespace attribute naming the (sub-)parser that left arguments unrecognized, for the error.
_UNRECOGNIZED_BY = "_accel_unrecognized_by"


class AccelArgumentParser(argparse.ArgumentParser):
    """ArgumentParser with short errors; sub-parsers of ``accel`` inherit the class.

    It uses `help_formatter()` by default. An argument error prints one usage line, the error
    and a hint at ``-h`` (not the whole option list), with exit status 2; an unknown option comes
    with the closest known ones (see `accel_launch.arg_errors`).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", help_formatter)
        super().__init__(*args, **kwargs)

    def parse_known_args(  # type: ignore[override]
        self, args: Any = None, namespace: Any = None
    ) -> tuple[argparse.Namespace, list[str]]:
        """argparse's ``parse_known_args``, noting which parser left arguments over (a sub-command's
        extras reach the top parser, whose options are the wrong ones to suggest from).

        Args:
            args: the arguments (``sys.argv[1:]`` when None).
            namespace: the namespace to fill (a new one when None).
        """
        namespace, extras = super().parse_known_args(args, namespace)
        if extras and not hasattr(namespace, _UNRECOGNIZED_BY):
            setattr(namespace, _UNRECOGNIZED_BY, self)
        return namespace, extras

    def parse_args(self, args: Any = None, namespace: Any = None) -> argparse.Namespace:  # type: ignore[override]
        """argparse's ``parse_args``; unrecognized arguments are reported by the (sub-)parser that met them,
        with the closest known options.

        Args:
            args: the arguments (``sys.argv[1:]`` when None).
            namespace: the namespace to fill (a new one when None).
        """
        namespace, extras = self.parse_known_args(args, namespace)
        owner = vars(namespace).pop(_UNRECOGNIZED_BY, self)
        if extras:
            from accel_launch.arg_errors import unrecognized_message

            owner.error(unrecognized_message(extras, owner))
        return namespace

    def error(self, message: str) -> NoReturn:
        """Print the short usage, ``message`` and a hint at ``-h`` on stderr; exit with status 2.

        Args:
            message: argparse's error message.
        """
        from accel_launch.arg_errors import error_text

        self.exit(2, error_text(self, message))


#: Older flag names still accepted for an option (the documented system's spellings).
FLAG_ALIASES: dict[str, tuple[str, ...]] = {
    "fsdp_backward_prefetch": ("fsdp_backward_prefetch_policy",),
}


def _flags(option: Option) -> list[str]:
    names = []
    for name in (option.dest, *FLAG_ALIASES.get(option.dest, ())):
        names.append(f"--{name}")
        if "_" in name:
            names.append(f"--{name.replace('_', '-')}")
    return [*option.short, *names]


def _type(option: Option) -> Any:
    if option.kind == "int":
        return int
    if option.kind == "float":
        return float
    return str


def add_launch_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add every launch flag (grouped as in the documentation) and the script positionals to ``parser``."""
    groups: dict[str, Any] = {}
    for option in OPTIONS:
        group = groups.get(option.group)
        if group is None:
            group = parser if option.group == "General" else parser.add_argument_group(option.group)
            groups[option.group] = group
        kwargs: dict[str, Any] = {"dest": option.dest, "default": None, "help": option.help}
        if option.kind == "switch":
            kwargs.update(action="store_true", default=False)
        elif option.append:
            kwargs.update(action="append", type=str)
        else:
            kwargs["type"] = _type(option)
            if option.dest == "dynamo_backend":
                kwargs["choices"] = _DYNAMO_CHOICES
                kwargs["type"] = str.lower
            elif option.choices is not None and option.kind == "str":
                kwargs["choices"] = option.choices
            elif option.choices is not None and option.kind == "int":
                kwargs["choices"] = [int(c) for c in option.choices]
        if option.default is not None and option.kind != "switch":
            kwargs["help"] = f"{option.help} (default: {option.default})"
        group.add_argument(*_flags(option), **kwargs)
    parser.add_argument(
        "training_script", help="The script to launch (a module name with -m, a program with --no_python)."
    )
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER, help="Arguments of the training script.")
    return parser


def launch_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The ``launch`` parser: a sub-command of ``accel`` when ``subparsers`` is given, else standalone."""
    if subparsers is not None:
        parser = subparsers.add_parser(
            "launch", help=DESCRIPTION, description=DESCRIPTION, allow_abbrev=False, formatter_class=help_formatter
        )
    else:
        parser = AccelArgumentParser("accel launch", description=DESCRIPTION, allow_abbrev=False)
    return add_launch_arguments(parser)


def given_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The launch options actually given on the command line: a value that is not ``None`` (a boolean
    switch, which parses to ``False`` when absent, counts only when ``True``)."""
    out: dict[str, Any] = {}
    for option in OPTIONS:
        value = getattr(args, option.dest, None)
        if value is None or (option.kind == "switch" and value is False):
            continue
        out[option.dest] = value
    return out
