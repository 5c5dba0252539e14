"""``accel launch``: start a script on one or several processes and machines.

Flags win over the config file, the config file over the defaults; with neither, the launcher picks
what suits this machine and says so once. Runnable as ``python -m accel_launch.commands.launch``.
"""

from __future__ import annotations

import argparse
import sys

from accel_launch.launch_args import given_flags, launch_command_parser

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time: `accel --help` stays fast
    from typing import Any

_NOT_CHOICES = {
    "config_file",
    "quiet",
    "module",
    "no_python",
    "debug",
    "dry_run",
    "json",
    "cpu_fallback",
    "requeue_on_preemption",
}


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``launch`` on ``accel``'s sub-parsers."""
    parser = launch_command_parser(subparsers)
    parser.set_defaults(func=run)
    return parser


def load_config(config_file: str | None) -> Any:
    """The config to launch with: ``config_file`` (must exist), else the default file if present, else None."""
    from accel_launch.commands.config.config_args import config_from_dict, find_config_file, read_config_file

    path = find_config_file(config_file)
    if path is None:
        return None
    return config_from_dict(read_config_file(path), source=str(path))


def plan_launch(args: argparse.Namespace) -> Any:
    """The launch plan of parsed ``accel launch`` arguments (reads the config file, may count devices)."""
    import os

    from accel_launch.machine import cpu_machine, detect_machine
    from accel_launch.plan import resolve
    from accel_state.cluster import launch_topology

    flags = given_flags(args)
    config = load_config(flags.get("config_file"))
    forced_cpu = flags.get("cpu") or (
        config is not None and getattr(config, "use_cpu", False) and "multi_gpu" not in flags
    )
    machine = cpu_machine() if forced_cpu else detect_machine()
    topology = launch_topology(os.environ)
    plan = resolve(
        flags, config, machine, args.training_script, args.training_script_args, topology, environ=os.environ
    )
    if not flags.get("quiet"):
        for warning in plan.warnings:
            print(f"accel launch: warning: {warning}", file=sys.stderr)
    chose_anything = any(name not in _NOT_CHOICES for name in flags) or plan.scheduler is not None
    if config is None and not chose_anything and plan.notes and not flags.get("dry_run"):
        print(
            f"accel launch: no config file and no launch flags, so running {', '.join(plan.notes)}. "
            "Run `accel config` (or pass flags) to choose.",
            file=sys.stderr,
        )
    return plan


def run(args: argparse.Namespace) -> int:
    """The CLI: `launch_command()`, with its errors as one clear line and exit status 2, and a failed
    run's exit status passed on (the processes already said why)."""
    import subprocess

    from accel_launch.runner import LaunchError
    from accel_launch.values import ConfigError

    try:
        return launch_command(args)
    except subprocess.CalledProcessError as failed:
        return failed.returncode
    except (ConfigError, LaunchError, FileNotFoundError, ConnectionError) as error:
        if getattr(args, "debug", False):
            raise
        print(f"accel launch: error: {error}", file=sys.stderr)
        return 2


def launch_command(args: argparse.Namespace) -> int:
    """Run ``accel launch`` with arguments parsed by `launch_command_parser()` (for code that drives it).

    Args:
        args: the parsed arguments (flags not given are ``None``, as the parser leaves them).

    Returns:
        0 once every process has ended well.

    Raises:
        ValueError: flags or config values that cannot be used together or are out of range
            (`ConfigError`, `LaunchError`).
        FileNotFoundError: the training script, the program (``--no_python``) or the config file is missing.
        ConnectionError: the main process port is already taken on this machine.
        subprocess.CalledProcessError: the run ended with a non-zero exit status (``returncode``).
    """
    import subprocess

    from accel_launch.commands_build import script_command
    from accel_launch.runner import execute

    plan = plan_launch(args)
    if getattr(args, "dry_run", False):
        from accel_launch.dry_run import print_plan

        print_plan(plan, as_json=bool(getattr(args, "json", False)))
        return 0
    code = execute(plan)
    if code != 0:
        raise subprocess.CalledProcessError(code, script_command(plan))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = launch_command_parser()
    args = parser.parse_args(argv)
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
