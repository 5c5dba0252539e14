"""``accel env``: versions, platform, devices, memory and the active config, ready to paste into an issue."""

from __future__ import annotations

import argparse
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time: `accel --help` stays fast
    from typing import Any

DESCRIPTION = "Print the versions, platform, devices, memory and config file in use (paste it into an issue)."


# Every accel distribution, the meta-package first: what `accel env` and `accel --version` report.
DISTRIBUTIONS = (
    "accel",
    "accel-state",
    "accel-data",
    "accel-bigmodel",
    "accel-quant",
    "accel-tracking",
    "accel-train",
    "accel-launch",
)


def installed_versions() -> dict[str, str]:
    """Version of each accel distribution installed here (those not installed are left out)."""
    versions = {name: _version(name) for name in DISTRIBUTIONS}
    return {name: value for name, value in versions.items() if value != "not installed"}


def version_line() -> str:
    """``accel --version``: the installed accel distributions and their versions, on one line."""
    versions = installed_versions()
    return ", ".join(f"{name} {value}" for name, value in versions.items())


def _version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def _headline_version() -> str:
    """The first line's version: the meta-package's, or, without it, the launcher's (said so)."""
    meta = _version("accel")
    if meta != "not installed":
        return meta
    return f"{_version('accel-launch')} (accel-launch; the accel meta-package is not installed)"


def _memory_gib() -> str:
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return f"{total / 2**30:.2f} GiB"
    except (ValueError, OSError, AttributeError):
        return "unknown"


def environment_info(config_file: str | None = None) -> dict[str, Any]:
    """Facts about this installation and machine, as an ordered mapping (torch imported here)."""
    import platform

    import torch

    from accel_launch.machine import detect_machine

    machine = detect_machine()
    info: dict[str, Any] = {
        "`accel` version": _headline_version(),
        "Platform": platform.platform(),
        "`accel` bash location": _which_accel(),
        "Python version": platform.python_version(),
        "Numpy version": _version("numpy"),
        "PyTorch version": f"{torch.__version__} ({machine.device})",
        "PyTorch accelerator": f"{machine.num_devices} x {machine.device}"
        if machine.num_devices
        else "none (CPU only)",
        "CPU cores": machine.cpu_cores,
        "System RAM": _memory_gib(),
    }
    if machine.device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info["GPU type"] = torch.cuda.get_device_name(0)
        info["GPU memory"] = f"{props.total_memory / 2**30:.2f} GiB"
    for package in DISTRIBUTIONS[1:]:  # the meta-package's version is the first line
        info[f"{package} version"] = _version(package)
    info["config"] = _config_lines(config_file)
    return info


def _which_accel() -> str:
    import shutil

    return shutil.which("accel") or "not on PATH"


def _config_lines(config_file: str | None) -> Any:
    from accel_launch.commands.config.config_args import find_config_file, read_config_file

    try:
        path = find_config_file(config_file)
    except FileNotFoundError as error:
        return f"{error}"
    if path is None:
        return "Not found"
    try:
        from accel_launch.commands.config.config_args import config_from_dict

        values = config_from_dict(read_config_file(path), source=str(path)).to_dict()
    except ValueError as error:
        return f"{path}: invalid ({error})"
    return {"path": str(path), **values}


def format_info(info: dict[str, Any]) -> str:
    """The paste-able text: one ``- key: value`` line each, the config indented below."""
    lines = ["", "Copy-and-paste the text below in your GitHub issue", ""]
    for key, value in info.items():
        if key == "config":
            if isinstance(value, dict):
                lines.append("- `accel` config:")
                lines.extend(f"\t- {k}: {v}" for k, v in value.items())
            else:
                lines.append(f"- `accel` config: {value}")
        else:
            lines.append(f"- {key}: {value}")
    return "\n".join(lines) + "\n"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("env", help=DESCRIPTION, description=DESCRIPTION)
    _fill(parser)
    return parser


def _fill(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config_file",
        "--config-file",
        default=None,
        help="The config file to show (default: the default config file).",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    sys.stdout.write(format_info(environment_info(args.config_file)))
    return 0


def env_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The ``env`` parser, added to ``subparsers`` when given, else standalone."""
    if subparsers is not None:
        return add_parser(subparsers)
    parser = argparse.ArgumentParser("accel env", description=DESCRIPTION)
    _fill(parser)
    return parser


def env_command(args: argparse.Namespace) -> int:
    """Print ``accel env``'s report for parsed ``args``."""
    return run(args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser("accel env", description=DESCRIPTION)
    _fill(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
