"""``accel to-fsdp2``: turn an FSDP1 config file into an FSDP2 one.

FSDP2 replaces the sharding strategy by ``fsdp_reshard_after_forward`` and drops the keys that no
longer apply (prefetch policies, ``sync_module_states``, ``use_orig_params``). The conversion is a pure
function over the mapping; the command reads and writes the files.
"""

from __future__ import annotations

import argparse
import sys

from accel_state.enums import FSDPShardingStrategy

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time: `accel --help` stays fast
    from typing import Any

DESCRIPTION = "Convert the FSDP1 settings of a config file to FSDP2."

_RESHARD = {"FULL_SHARD": True, "HYBRID_SHARD": True, "SHARD_GRAD_OP": False, "HYBRID_SHARD_ZERO2": False}
_NUMBERED = FSDPShardingStrategy.list()
_DROPPED = (
    "fsdp_backward_prefetch",
    "fsdp_backward_prefetch_policy",
    "fsdp_forward_prefetch",
    "fsdp_sync_module_states",
    "fsdp_use_orig_params",
)


class ConversionError(ValueError):
    """A config that cannot become an FSDP2 config; the message says why."""


def convert_config(config: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The FSDP2 version of ``config`` (a new mapping) and notes on what changed."""
    fsdp = dict(config.get("fsdp_config") or {})
    if not fsdp and config.get("distributed_type") != "FSDP":
        raise ConversionError("the config has no FSDP settings (no `fsdp_config`, distributed_type is not FSDP)")
    if int(fsdp.get("fsdp_version", 1)) == 2:
        return dict(config), ["already an FSDP2 config; nothing to change"]
    notes: list[str] = []
    strategy = fsdp.pop("fsdp_sharding_strategy", None)
    if strategy is not None:
        text = str(strategy).upper()
        if text.isdigit() and 1 <= int(text) <= 5:
            text = _NUMBERED[int(text) - 1]
        if text == "NO_SHARD":
            raise ConversionError(
                "fsdp_sharding_strategy NO_SHARD has no FSDP2 equivalent: use distributed_type MULTI_GPU (DDP) instead"
            )
        if text not in _RESHARD:
            raise ConversionError(
                f"unknown fsdp_sharding_strategy {strategy!r}; expected one of {', '.join(_NUMBERED)}"
            )
        fsdp["fsdp_reshard_after_forward"] = _RESHARD[text]
        notes.append(f"fsdp_sharding_strategy {text} -> fsdp_reshard_after_forward {str(_RESHARD[text]).lower()}")
    for key in _DROPPED:
        if key in fsdp:
            fsdp.pop(key)
            notes.append(f"removed {key} (not used by FSDP2)")
    fsdp["fsdp_version"] = 2
    out = dict(config)
    out["fsdp_config"] = dict(sorted(fsdp.items()))
    return out, notes


def convert_config_to_fsdp2(config: dict[str, Any]) -> dict[str, Any]:
    """The FSDP2 version of ``config`` (the documented name of `convert_config()`, without the notes)."""
    return convert_config(config)[0]


def load_config(config_file: str) -> dict[str, Any]:
    """The mapping held by a YAML or JSON config file (the documented name).

    Raises:
        ValueError: the file is empty, not valid YAML/JSON, or does not hold a mapping.
    """
    from accel_launch.commands.config.config_args import read_config_file

    config = read_config_file(config_file)
    if not config:
        raise ValueError(f"the config file {config_file} is empty")
    return config


def _fill(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config_file", "--config-file", required=True, help="The FSDP1 config file to convert.")
    parser.add_argument(
        "--output_file",
        "--output-file",
        default=None,
        help="Where to write the FSDP2 config (default: the input file, with --overwrite).",
    )
    parser.add_argument("--overwrite", action="store_true", help="Overwrite the output file if it exists.")
    parser.set_defaults(func=run)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("to-fsdp2", help=DESCRIPTION, description=DESCRIPTION)
    _fill(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    """The CLI: `to_fsdp2_command()`, its errors as one line and exit status 2."""
    try:
        return to_fsdp2_command(args)
    except (ValueError, OSError) as error:  # OSError: FileNotFoundError, IsADirectoryError, FileExistsError, ...
        print(f"accel to-fsdp2: error: {error}", file=sys.stderr)
        return 2


def to_fsdp2_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The ``to-fsdp2`` parser (the documented name): on ``subparsers`` when given, else standalone."""
    if subparsers is not None:
        return add_parser(subparsers)
    parser = argparse.ArgumentParser("accel to-fsdp2", description=DESCRIPTION)
    _fill(parser)
    return parser


def to_fsdp2_command(args: argparse.Namespace) -> int:
    """Convert ``args.config_file`` to FSDP2 and write it (the documented function behind ``to-fsdp2``).

    Args:
        args: parsed ``to-fsdp2`` arguments (``config_file``, ``output_file``, ``overwrite``).

    Returns:
        0 once the converted file is written (the changes are printed).

    Raises:
        FileNotFoundError: the config file does not exist (``IsADirectoryError``: it is a folder).
        ValueError: neither ``--output_file`` nor ``--overwrite`` was given; the file is empty or not a
            valid config, or its settings have no FSDP2 equivalent.
        FileExistsError: the output file exists and ``--overwrite`` was not given.
        yaml.YAMLError: the file is not valid YAML (also a ``ValueError``:
            `ConfigError`).
    """
    import json
    from pathlib import Path

    import yaml

    from accel_launch.commands.config.config_args import config_from_dict

    source = Path(args.config_file)
    if source.is_dir():
        raise IsADirectoryError(f"the config file {source} is a folder: pass the YAML or JSON file inside it")
    if not source.is_file():
        raise FileNotFoundError(f"the config file {source} does not exist")
    if not args.output_file and not args.overwrite:
        raise ValueError(
            f"no --output_file given: pass --output_file <new file>, or --overwrite to convert {source} in place"
        )
    target = Path(args.output_file) if args.output_file else source
    if target.exists() and not args.overwrite:
        raise FileExistsError(f"{target} exists; pass --overwrite to replace it (or choose another --output_file)")
    converted, notes = convert_config(load_config(str(source)))
    config_from_dict(converted, source=str(target))  # the result must be a valid config
    text = (
        json.dumps(converted, indent=2) + "\n"
        if target.suffix == ".json"
        else yaml.safe_dump(converted, sort_keys=True)
    )
    target.write_text(text)
    for note in notes:
        print(f"- {note}")
    print(f"FSDP2 config written to {target}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run(to_fsdp2_command_parser().parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
