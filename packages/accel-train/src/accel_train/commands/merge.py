"""``accel merge-weights``: merge a sharded FSDP or DeepSpeed checkpoint into one safetensors (or .bin) file."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "merge-weights",
        help="Merge the shards of an FSDP or DeepSpeed checkpoint into a single weights file.",
        description="Merge a torch.distributed.checkpoint folder written by FSDP, or a DeepSpeed ZeRO checkpoint, into "
        "one model file.",
    )
    _add_arguments(parser)
    parser.set_defaults(func=run)
    return parser


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "checkpoint_directory",
        help="Folder of the sharded checkpoint (a .metadata file, or DeepSpeed's *_model_states.pt files).",
    )
    parser.add_argument("output_path", help="Folder to write model.safetensors (or pytorch_model.bin) into.")
    parser.add_argument(
        "--unsafe_serialization",
        "--unsafe-serialization",
        action="store_true",
        help="Write pytorch_model.bin with torch.save instead of safetensors.",
    )
    parser.add_argument(
        "--max_shard_size",
        "--max-shard-size",
        default=None,
        help="Split the merged weights into files of at most this size (e.g. 5GB) with an index file.",
    )
    parser.add_argument(
        "--remove_checkpoint_dir",
        "--remove-checkpoint-dir",
        action="store_true",
        help="Delete the sharded checkpoint once merged.",
    )


def run(args: argparse.Namespace) -> int:
    from accel_train.checkpoint.merge import merge_fsdp_weights

    try:
        target = merge_fsdp_weights(
            args.checkpoint_directory,
            args.output_path,
            safe_serialization=not args.unsafe_serialization,
            remove_checkpoint_dir=args.remove_checkpoint_dir,
            max_shard_size=_size(args.max_shard_size),
        )
    except (OSError, ValueError) as error:  # UnsafeCheckpointError is a ValueError; disk full an OSError
        print(f"accel merge-weights: {error}", file=sys.stderr)
        return 2
    print(f"Merged weights written to {target}")
    return 0


def _size(value: str | None) -> int | str | None:
    if value is None:
        return None
    return int(value) if value.isdigit() else value


def merge_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The ``merge-weights`` parser, added to ``subparsers`` when given, else standalone."""
    if subparsers is not None:
        return add_parser(subparsers)
    parser = argparse.ArgumentParser("accel merge-weights")
    _add_arguments(parser)
    parser.set_defaults(func=run)
    return parser


def merge_command(args: argparse.Namespace) -> int:
    """Run ``accel merge-weights`` with parsed ``args``."""
    return run(args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser("accel merge-weights")
    _add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
