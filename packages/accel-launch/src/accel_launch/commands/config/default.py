"""``accel config default`` and ``write_basic_config``: a config for this machine without questions.

Uses every GPU of the machine (several GPUs: a multi-GPU run), or the CPU when there is none.
An existing file is never overwritten.
"""

from __future__ import annotations

import argparse
import sys

from accel_state.enums import MIXED_PRECISION_CHOICES

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time: `accel --help` stays fast
    from pathlib import Path
    from typing import Any

DESCRIPTION = "Write a basic config file for this machine, with only a few settings."


def basic_config_dict(mixed_precision: str, device: str, num_devices: int) -> dict[str, Any]:
    """The content of a basic config for a machine with ``num_devices`` of ``device`` (pure)."""
    mixed_precision = str(mixed_precision).lower()
    if mixed_precision not in MIXED_PRECISION_CHOICES:
        *first, last = (repr(choice) for choice in MIXED_PRECISION_CHOICES)
        raise ValueError(f"`mixed_precision` should be one of {', '.join(first)}, or {last}; got {mixed_precision!r}")
    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "mixed_precision": mixed_precision,
        "num_machines": 1,
        "machine_rank": 0,
        "main_training_function": "main",
        "debug": False,
        "rdzv_backend": "static",
        "same_network": False,
        "enable_cpu_affinity": False,
    }
    if device not in ("cpu", "mps") and num_devices > 1:
        config.update(
            distributed_type=f"MULTI_{'GPU' if device == 'cuda' else device.upper()}",
            num_processes=num_devices,
            use_cpu=False,
            gpu_ids="all",
        )
    elif device not in ("cpu",) and num_devices >= 1:
        config.update(distributed_type="NO", num_processes=1, use_cpu=False)
    else:
        config.update(distributed_type="NO", num_processes=1, use_cpu=True)
    return config


def write_basic_config(mixed_precision: str = "no", save_location: str | None = None) -> Path | bool:
    """Write a basic config for this machine at ``save_location`` (default: the default config file).

    Returns the path written, or False when a config already exists there (it is left as it is).

    Args:
        mixed_precision: `no`, `fp16`, `bf16` or `fp8`.
        save_location: Where the file is written; `None` uses the default config file.
    """
    from pathlib import Path

    from accel_launch.commands.config.config_args import config_from_dict, default_yaml_config_path
    from accel_launch.machine import detect_machine

    path = Path(save_location) if save_location is not None else default_yaml_config_path()
    if path.exists():
        print(
            f"Configuration already exists at {path}, will not override. Run `accel config` to change it, or "
            "write another file with `accel config default --config_file PATH` "
            "(`save_location=PATH` from Python).",
            file=sys.stderr,
        )
        return False
    machine = detect_machine()
    config = config_from_dict(basic_config_dict(mixed_precision, machine.device, machine.num_devices))
    if path.suffix == ".json":
        config.to_json_file(path)
    else:
        config.to_yaml_file(path)
    return path


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("default", help=DESCRIPTION, description=DESCRIPTION)
    parser.add_argument(
        "--config_file",
        "--config-file",
        default=None,
        dest="default_config_file",
        help="Where to save the config file (default: the default location).",
    )
    parser.add_argument(
        "--mixed_precision",
        "--mixed-precision",
        choices=list(MIXED_PRECISION_CHOICES),
        default="no",
        help="Mixed precision mode.",
    )
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    location = getattr(args, "default_config_file", None) or getattr(args, "config_file", None)
    path = write_basic_config(args.mixed_precision, location)
    if path:
        print(f"accel configuration saved at {path}")
        return 0
    return 1
