"""``accel test``: run the self-test under a launch configuration and say plainly what passed."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from typing import Any


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "test",
        help="Check that accel works with your configuration (runs a short self-test through `accel launch`).",
        description="Run accel's self-test through `accel launch` with the given (or default) config file.",
    )
    _add_arguments(parser)
    parser.set_defaults(func=run)
    return parser


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config_file",
        "--config-file",
        default=None,
        help="Config file to test (default: the default config location of `accel config`).",
    )


def script_path() -> str:
    """Path of the self-test script."""
    from importlib.util import find_spec

    spec = find_spec("accel_train.test_utils.test_script")
    assert spec is not None and spec.origin is not None
    return spec.origin


def run(args: argparse.Namespace) -> int:
    from importlib.util import find_spec

    if args.config_file is not None and not os.path.isfile(args.config_file):
        print(f"accel test: config file {args.config_file} does not exist", file=sys.stderr)
        return 2
    if find_spec("accel_launch") is not None:
        command = [sys.executable, "-m", "accel_launch.cli", "launch"]
        if args.config_file is not None:
            command += ["--config_file", args.config_file]
    elif args.config_file is not None:
        from accel_state.install_hints import install_hint

        print(f"accel test: --config_file needs the launcher: {install_hint('accel-launch')}", file=sys.stderr)
        return 2
    else:
        print("accel test: accel-launch is not installed; running the self-test in this single process")
        command = [sys.executable]
    command.append(script_path())
    print("Running: " + " ".join(command), flush=True)
    returncode, failed_checks = _run_and_watch(command)
    if returncode == 0:
        print("Test is a success! You are ready for your distributed training!")
    elif failed_checks:
        print(
            f"accel test: the self-test failed (exit status {returncode}): {', '.join(failed_checks)}; "
            "see the FAIL lines above.",
            file=sys.stderr,
        )
    else:
        print(
            f"accel test: the self-test stopped (exit status {returncode}) before it could report its checks: "
            "a process failed while starting or setting up; its error is printed above.",
            file=sys.stderr,
        )
    return returncode


def _run_and_watch(command: list[str]) -> tuple[int, list[str]]:
    """Run ``command``, passing its output through as it comes; return its exit status and the names
    of the checks it reported as failed (``FAIL  <name> (process i):`` lines)."""
    import threading

    failed: list[str] = []

    def pump(source: Any, sink: Any) -> None:
        for line in iter(source.readline, ""):
            sink.write(line)
            sink.flush()
            if line.startswith("FAIL  "):
                name = line[len("FAIL  ") :].split(" (process", 1)[0].strip()
                if name not in failed:
                    failed.append(name)
        source.close()

    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
    threads = [
        threading.Thread(target=pump, args=(process.stdout, sys.stdout), daemon=True),
        threading.Thread(target=pump, args=(process.stderr, sys.stderr), daemon=True),
    ]
    for thread in threads:
        thread.start()
    returncode = process.wait()
    for thread in threads:
        thread.join()
    return returncode, failed


def test_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The ``test`` parser (the documented name): on ``subparsers`` when given, else standalone."""
    if subparsers is not None:
        return add_parser(subparsers)
    parser = argparse.ArgumentParser("accel test")
    _add_arguments(parser)
    return parser


def test_command(args: argparse.Namespace) -> int:
    """Run the self-test for parsed arguments (the documented name of `run()`)."""
    return run(args)


test_command_parser.__test__ = False  # type: ignore[attr-defined]  # not a pytest test, despite the name
test_command.__test__ = False  # type: ignore[attr-defined]


def main(argv: list[str] | None = None) -> int:
    return run(test_command_parser().parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
