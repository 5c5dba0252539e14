"""``accel config``: the questionnaire that writes the config file, plus ``config default`` and ``config update``.

Runnable as ``python -m accel_launch.commands.config``. The file format lives in ``config_args``.
"""

from __future__ import annotations

import argparse
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time: `accel --help` stays fast
    from typing import Any

DESCRIPTION = "Answer a few questions and save the config file used by `accel launch`."
_PATH_HELP = (
    "Where to save the config file (default: default_config.yaml in $HF_HOME/accelerate, else "
    "$XDG_CACHE_HOME/huggingface/accelerate, else ~/.cache/huggingface/accelerate)."
)


# Names of the config-file module that the documented ``commands.config`` package also offers
# (libraries import ``default_config_file`` and ``load_config_from_file`` from it); read lazily, so
# that ``default_config_file`` follows ``HF_HOME`` and ``accel --help`` does not import them.
_FROM_CONFIG_ARGS = (
    "default_config_file",
    "default_yaml_config_file",
    "default_json_config_file",
    "cache_dir_path",
    "hf_cache_home",
    "load_config_from_file",
    "ClusterConfig",
    "SageMakerConfig",
    "BaseConfig",
)


def __getattr__(name: str) -> Any:
    if name in _FROM_CONFIG_ARGS:
        from accel_launch.commands.config import config_args

        return getattr(config_args, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def get_config_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The ``config`` parser, on ``subparsers`` when given (the documented programmatic entry)."""
    if subparsers is None:
        return _fill(argparse.ArgumentParser("accel config", description=DESCRIPTION))
    return add_parser(subparsers)


def config_command(args: argparse.Namespace) -> int:
    """Run ``accel config`` with parsed ``args`` (the questionnaire, or the chosen sub-command)."""
    return int(args.func(args) or 0)


def _fill(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    from accel_launch.commands.config import default, update

    parser.add_argument("--config_file", "--config-file", default=None, help=_PATH_HELP)
    sub = parser.add_subparsers(title="subcommands", metavar="{default,update}")
    default.add_parser(sub)
    update.add_parser(sub)
    parser.set_defaults(func=run)
    return parser


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``config`` (with ``default`` and ``update``) on ``accel``'s sub-parsers."""
    from accel_launch.launch_args import help_formatter

    return _fill(
        subparsers.add_parser("config", help=DESCRIPTION, description=DESCRIPTION, formatter_class=help_formatter)
    )


def run(args: argparse.Namespace) -> int:
    """Ask the questions, then save the answers (YAML, or JSON when the path ends in .json)."""
    from accel_launch.commands.config.config_args import default_yaml_config_path
    from accel_launch.commands.config.questionnaire import get_user_input

    try:
        config = get_user_input()
    except (EOFError, KeyboardInterrupt):
        print("\naccel config: stopped; nothing was written", file=sys.stderr)
        return 1
    path = args.config_file or str(default_yaml_config_path())
    if str(path).endswith(".json"):
        config.to_json_file(path)
    else:
        config.to_yaml_file(path)
    print(f"accel configuration saved at {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = _fill(argparse.ArgumentParser("accel config", description=DESCRIPTION))
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)
