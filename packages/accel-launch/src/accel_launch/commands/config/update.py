"""``accel config update``: rewrite a config file with the current keys, keeping every setting.

Legacy spellings are translated and the file is validated on the way (an unknown key is an error and
the file is left untouched).
"""

from __future__ import annotations

import argparse
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time: `accel --help` stays fast
    from typing import Any

DESCRIPTION = "Update a config file to the current format, keeping its settings."


def update_config(config_file: str | None) -> str:
    """Load, validate and rewrite ``config_file`` (default: the default config); its path."""
    from accel_launch.commands.config.config_args import default_config_path, load_config_from_file

    config = load_config_from_file(config_file)
    path = config_file or str(default_config_path())
    if str(path).endswith(".json"):
        config.to_json_file(path)
    else:
        config.to_yaml_file(path)
    return str(path)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("update", help=DESCRIPTION, description=DESCRIPTION)
    parser.add_argument(
        "--config_file",
        "--config-file",
        default=None,
        dest="update_config_file",
        help="The config file to update (default: the default config file).",
    )
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from accel_launch.values import ConfigError

    try:
        path = update_config(getattr(args, "update_config_file", None) or getattr(args, "config_file", None))
    except (ConfigError, FileNotFoundError) as error:
        print(f"accel config update: error: {error}", file=sys.stderr)
        return 2
    print(f"Successfully updated the configuration file at {path}")
    return 0
