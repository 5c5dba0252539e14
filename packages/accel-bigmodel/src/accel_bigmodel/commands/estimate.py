"""``accel estimate-memory``: memory needed to load (and train) a model, per dtype. Torch-free at import."""

from __future__ import annotations

import argparse
from typing import Any

DTYPE_CHOICES = ["float32", "float16", "int8", "int4"]


def _configure(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("model_name", help="Hub id, local config.json or folder, or package.module:factory.")
    parser.add_argument(
        "--library_name",
        choices=["timm", "transformers"],
        default=None,
        help="Library the model belongs to, when the Hub does not say.",
    )
    parser.add_argument(
        "--dtypes",
        nargs="+",
        choices=DTYPE_CHOICES,
        default=list(DTYPE_CHOICES),
        metavar="{float32,float16,int8,int4}",
        help="Dtypes to report (default: all).",
    )
    parser.add_argument(
        "--ep_size",
        type=_ep_size,
        default=1,
        help="Mixture-of-experts models: the number of processes the experts are split over (expert "
        "parallelism); reports per process the bytes of the experts (divided by it) and of the rest. It must "
        "divide the expert count of every expert module. Default 1: the ordinary table.",
    )
    parser.add_argument(
        "--trust_remote_code",
        action="store_true",
        help="Allow custom model code from the Hub (only for repositories you trust).",
    )
    parser.set_defaults(func=run)
    return parser


def _ep_size(text: str) -> int:
    """``--ep_size``'s value: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"must be an integer >= 1, the number of processes the experts are split over; got {text!r}"
        )
    return value


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``estimate-memory`` sub-command to ``accel``'s sub-parsers."""
    parser = subparsers.add_parser(
        "estimate-memory",
        help="Estimate the memory a model needs, per dtype.",
        description="Build the model on the meta device and report its largest layer, total size and an Adam training estimate.",
    )
    return _configure(parser)


def run(args: argparse.Namespace) -> int:
    """The CLI: `estimate_command()`, a model that cannot be found or built as one line and exit status 1."""
    import sys

    from accel_bigmodel.estimate import ModelBuildError

    try:
        return estimate_command(args)
    except (ValueError, ImportError, OSError, ModelBuildError) as err:
        print(f"accel estimate-memory: {err}", file=sys.stderr)
        return 1


def estimate_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The ``estimate-memory`` parser (the documented name): on ``subparsers`` when given, else standalone."""
    if subparsers is not None:
        return add_parser(subparsers)
    return _configure(argparse.ArgumentParser("accel estimate-memory"))


def estimate_command(args: argparse.Namespace) -> int:
    """Print the estimate table for parsed arguments (the documented function behind ``estimate-memory``).

    Args:
        args: parsed ``estimate-memory`` arguments.

    Returns:
        0 once the table is printed.

    Raises:
        OSError: the model is not on the Hub, is gated, or the Hub cannot be reached; a local config file
            named does not exist (``FileNotFoundError``). The documented system's type for these.
        ValueError: the name is no Hub id or local file, the factory cannot be imported, the Hub does
            not say which library the model uses, or ``--ep_size`` does not fit the model (no expert
            module, or an expert count it does not divide).
        RuntimeError: the library found no model to build in what was given
            (`ModelBuildError`).
        ImportError: the model's library (transformers, timm) is not installed.
    """
    from accel_bigmodel.estimate import format_table
    from accel_bigmodel.estimate import gather_data as gather
    from accel_bigmodel.expert_estimate import format_expert_parallel_table

    rows = gather(args)
    ep_size = getattr(args, "ep_size", 1)
    if ep_size == 1:
        print(format_table(args.model_name, rows))
    else:
        print(format_expert_parallel_table(args.model_name, rows, ep_size))
    return 0


def gather_data(args: argparse.Namespace) -> list[Any]:
    """Rows ``[dtype, largest_layer, total_size, training]`` (bytes) for parsed arguments; with
    ``--ep_size`` above 1, rows ``[dtype, experts, rest, total_size, training]`` (bytes per process)."""
    from accel_bigmodel.estimate import gather_data as gather

    return gather(args)


def verify_on_hub(repo: str, token: str | None = None) -> Any:
    """The Hub's model information for ``repo``, ``"gated"`` or ``"repo"`` (see
    `accel_bigmodel.estimate.verify_on_hub()`)."""
    from accel_bigmodel.estimate import verify_on_hub as verify

    return verify(repo, token)


def main(argv: list[str] | None = None) -> int:
    parser = _configure(argparse.ArgumentParser("accel estimate-memory"))
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
