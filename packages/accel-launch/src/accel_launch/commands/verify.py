"""``accel verify``: run a script with a launch configuration and with plain DDP, and compare them.

``accel verify [launch options] script.py [script args]`` takes every ``accel launch`` option, plus its
own: ``--steps``, ``--reference``, ``--rtol``, ``--atol``, ``--resume-at``, ``--resume-args`` and
``--json`` (which here names the file for
the record; ``accel launch``'s ``--json`` belongs to ``--dry_run``, which verify does not take).
Parsing and help import no torch. Runnable as ``python -m accel_launch.commands.verify``.
"""

from __future__ import annotations

import argparse

from accel_launch.launch_args import AccelArgumentParser, add_launch_arguments, help_formatter

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time: `accel --help` stays fast
    from typing import Any

DESCRIPTION = (
    "Run a script for a few optimizer steps with the given launch configuration and with a reference "
    "(plain DDP reading the same batches), and compare the loss, gradient norm, learning rate and final "
    "parameters step by step. Exit 0: they agree; 1: they differ; 2: a run could not start."
)


def _add_verify_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    group = parser.add_argument_group("Verify")
    group.add_argument("--steps", type=int, default=5, help="Optimizer steps to run and compare (default: 5).")
    group.add_argument(
        "--reference",
        default="ddp",
        help="What to compare with: ddp (plain DDP, one process per data-parallel rank of the run) or single "
        "(one process accumulating over that many micro-batches). Default: ddp.",
    )
    group.add_argument("--rtol", type=float, default=None, help="Relative tolerance (default: by precision).")
    group.add_argument("--atol", type=float, default=None, help="Absolute tolerance (default: by precision).")
    group.add_argument(
        "--resume-at",
        dest="resume_at",
        type=int,
        default=None,
        metavar="K",
        help="Also check a resume: the run saves after step K (1 <= K < --steps), a third launch of the same "
        "configuration resumes there, and its steps K+1..N must equal the run's.",
    )
    group.add_argument(
        "--resume-args",
        dest="resume_args",
        default=None,
        metavar="ARGS",
        help="With --resume-at: the script resumes by itself, given these extra arguments in the resumed "
        "launch ({checkpoint}: the saved folder, {step}: K). Default: the Accelerator loads the state for it.",
    )
    group.add_argument(
        "--json", dest="json_path", metavar="PATH", default=None, help="Write the comparison and both records here."
    )
    return parser


def _build(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    add_launch_arguments(parser)
    _add_verify_arguments(parser)
    parser.set_defaults(func=run)
    return parser


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``verify`` on ``accel``'s sub-parsers."""
    parser = subparsers.add_parser(
        "verify",
        help="Check that a launch configuration trains the same model as plain DDP.",
        description=DESCRIPTION,
        allow_abbrev=False,
        formatter_class=help_formatter,
        conflict_handler="resolve",
    )
    return _build(parser)


def verify_parser() -> argparse.ArgumentParser:
    """The standalone ``accel verify`` parser."""
    parser = AccelArgumentParser(
        "accel verify", description=DESCRIPTION, allow_abbrev=False, conflict_handler="resolve"
    )
    return _build(parser)


def run(args: argparse.Namespace) -> int:
    """The CLI: run both launches, print the report, return 0 / 1 / 2."""
    from accel_launch.verify.core import print_result, verify_from_args

    return print_result(verify_from_args(args))


def main(argv: list[str] | None = None) -> int:
    return run(verify_parser().parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
