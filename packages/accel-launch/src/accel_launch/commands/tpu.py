"""``accel tpu-config``: run start-up commands on every VM of a TPU pod through ``gcloud``.

The gcloud command is built by a pure function; ``--debug`` prints it instead of running it.
"""

from __future__ import annotations

import argparse
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time: `accel --help` stays fast
    from typing import Any

DESCRIPTION = "Run commands on every VM of a TPU pod (gcloud compute tpus tpu-vm ssh ... --worker all)."


class TPUConfigError(ValueError):
    """Missing TPU name, zone or commands; the message says which."""


def build_commands(
    commands: list[str] | None,
    command_file: str | None,
    install_accelerate: bool = False,
    accelerate_version: str = "latest",
) -> list[str]:
    """The shell commands to run on each VM (the file's lines after ``commands``), with the install first."""
    lines: list[str] = list(commands or [])
    if command_file:
        with open(command_file) as handle:
            lines.extend(line.strip() for line in handle if line.strip() and not line.startswith("#"))
    if not lines and not install_accelerate:
        raise TPUConfigError(
            "no command to run: pass --command (repeatable) or --command_file, or set `commands` in the config"
        )
    prefix = ["cd /usr/share"]
    if install_accelerate:
        if accelerate_version == "dev":
            prefix.append("pip install -U --pre accel")  # the newest pre-release of accel itself
        elif accelerate_version in ("latest", "", None):
            prefix.append("pip install -U accel")
        else:
            prefix.append(f"pip install accel=={accelerate_version}")
    return prefix + lines


def gcloud_command(
    tpu_name: str | None, tpu_zone: str | None, commands: list[str], use_alpha: bool = False
) -> list[str]:
    """``gcloud compute tpus tpu-vm ssh NAME --zone ZONE --command "a; b" --worker all``."""
    if not tpu_name:
        raise TPUConfigError("no TPU name: pass --tpu_name or set `tpu_name` in the config")
    if not tpu_zone:
        raise TPUConfigError("no TPU zone: pass --tpu_zone or set `tpu_zone` in the config")
    cmd = ["gcloud"]
    if use_alpha:
        cmd.append("alpha")
    return [
        *cmd,
        "compute",
        "tpus",
        "tpu-vm",
        "ssh",
        tpu_name,
        "--zone",
        tpu_zone,
        "--command",
        "; ".join(commands),
        "--worker",
        "all",
    ]


def tpu_pod_launch_command(plan: Any) -> list[str]:
    """The gcloud command that starts the same ``accel launch`` on every VM of a TPU pod."""
    import shlex

    values = plan.values
    remote = ["accel", "launch", "--tpu", "--no_tpu_cluster", "--num_processes", str(plan.num_processes)]
    if values.get("main_training_function"):
        remote += ["--main_training_function", values["main_training_function"]]
    if plan.values.get("mixed_precision") not in (None, "no"):
        remote += ["--mixed_precision", values["mixed_precision"]]
    remote += [plan.training_script, *plan.training_script_args]
    env = " ".join(f"export {item};" for item in values.get("env") or [])
    sudo = "sudo " if values.get("tpu_use_sudo") else ""
    line = f"{env} {sudo}{shlex.join(remote)}".strip()
    config = getattr(plan, "extra", {}) or {}
    return gcloud_command(config.get("tpu_name"), config.get("tpu_zone"), [line])


def _fill(parser: argparse.ArgumentParser) -> None:
    config = parser.add_argument_group("Config Arguments", "Arguments that can be configured through `accel config`.")
    config.add_argument("--config_file", "--config-file", default=None, help="Path to the config file to use.")
    config.add_argument("--tpu_name", "--tpu-name", default=None, help="The name of the TPU (default: the config's).")
    config.add_argument("--tpu_zone", "--tpu-zone", default=None, help="The zone of the TPU (default: the config's).")
    pod = parser.add_argument_group("TPU Arguments", "Arguments for options ran inside the TPU.")
    pod.add_argument("--use_alpha", "--use-alpha", action="store_true", help="Use `gcloud alpha`.")
    pod.add_argument(
        "--command_file", "--command-file", default=None, help="File with the commands to run on the pod on startup."
    )
    pod.add_argument("--command", action="append", default=None, help="A command to run on the pod (repeatable).")
    pod.add_argument(
        "--install_accelerate",
        "--install-accelerate",
        "--install_accel",
        action="store_true",
        help="Install accel on the pod.",
    )
    pod.add_argument(
        "--accelerate_version",
        "--accelerate-version",
        "--accel_version",
        default="latest",
        help="Version to install ('latest' or 'dev').",
    )
    pod.add_argument("--debug", action="store_true", help="Print the command instead of running it.")
    parser.set_defaults(func=run)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("tpu-config", help=DESCRIPTION, description=DESCRIPTION)
    _fill(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    """The CLI: `tpu_command_launcher()`, its errors as one line and exit status 2."""
    import subprocess

    try:
        return tpu_command_launcher(args)
    except subprocess.CalledProcessError as failed:
        return failed.returncode
    except (ValueError, FileNotFoundError) as error:
        print(f"accel tpu-config: error: {error}", file=sys.stderr)
        return 2


def tpu_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The ``tpu-config`` parser, added to ``subparsers`` when given, else standalone."""
    if subparsers is not None:
        return add_parser(subparsers)
    parser = argparse.ArgumentParser("accel tpu-config")
    _fill(parser)
    return parser


def tpu_command_launcher(args: argparse.Namespace) -> int:
    """Run the commands of ``args`` on every VM of the pod (``--debug``: print the gcloud line instead).

    Args:
        args: parsed ``tpu-config`` arguments.

    Returns:
        0 once gcloud has run the commands (or the line was printed).

    Raises:
        ValueError: no TPU name, zone or command (`TPUConfigError`), or an invalid config file.
        FileNotFoundError: the config file, the command file or ``gcloud`` is missing.
        subprocess.CalledProcessError: gcloud ended with a non-zero exit status.
    """
    import shlex
    import subprocess

    from accel_launch.commands.config.config_args import config_from_dict, find_config_file, read_config_file

    path = find_config_file(args.config_file)
    config = config_from_dict(read_config_file(path), source=str(path)) if path is not None else None
    name = args.tpu_name or getattr(config, "tpu_name", None)
    zone = args.tpu_zone or getattr(config, "tpu_zone", None)
    commands = args.command if args.command else getattr(config, "commands", None)
    command_file = args.command_file or (None if args.command else getattr(config, "command_file", None))
    cmd = gcloud_command(
        name,
        zone,
        build_commands(commands, command_file, args.install_accelerate, args.accelerate_version),
        args.use_alpha,
    )
    if args.debug:
        print(f"Running {shlex.join(cmd)}")
        return 0
    try:
        subprocess.run(cmd, check=True)
    except FileNotFoundError:
        raise FileNotFoundError("`gcloud` was not found on the PATH (install the Google Cloud CLI)") from None
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser("accel tpu-config", description=DESCRIPTION)
    _fill(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
