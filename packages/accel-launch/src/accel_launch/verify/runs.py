"""The two launches of `accel verify`: the requested configuration and its reference, each through the
real launcher (``python -m accel_launch.commands.launch``) in a child process of its own.

Each launch is a separate process because the launcher writes its settings into its own environment
(``os.environ``) before starting torchrun: two launches in one process would leak the first one's
FSDP or DeepSpeed variables into the second. The children find ``ACCEL_VERIFY_RECORD`` /
``ACCEL_VERIFY_STEPS`` in their environment; the Accelerator of the user's script reads them
(`accel_train.verify_recorder`), records the steps and ends the run. Only the record files cross back:
accel-launch never imports accel-train.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field

from accel_launch.options import OPTIONS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

#: Read by `accel_train.verify_recorder` in the processes of the script.
RECORD_VAR = "ACCEL_VERIFY_RECORD"
STEPS_VAR = "ACCEL_VERIFY_STEPS"

REFERENCES = ("ddp", "single")

#: Environment variables that choose a backend or a layout: the reference runs without them.
_LAYOUT_PREFIXES = (
    "ACCELERATE_USE_FSDP",
    "FSDP_",
    "ACCELERATE_USE_DEEPSPEED",
    "ACCELERATE_DEEPSPEED",
    "ACCELERATE_CONFIG_DS",
    "ACCELERATE_USE_MEGATRON_LM",
    "MEGATRON_LM_",
    "ACCELERATE_USE_PARALLELISM_CONFIG",
    "PARALLELISM_CONFIG_",
    "ACCELERATE_GRADIENT_ACCUMULATION_STEPS",
)

#: Lines of a failed run's output shown in the error.
_TAIL_LINES = 15


class VerifyError(Exception):
    """A run of `accel verify` could not start or did not record its steps (exit status 2)."""


@dataclass
class RunResult:
    """What one run recorded: the JSON record, its final parameters file and its log."""

    label: str
    record: dict[str, Any]
    params_path: str
    log_path: str
    launch_argv: list[str] = field(default_factory=list)


def flags_to_argv(flags: Mapping[str, Any]) -> list[str]:
    """The launch flags of ``flags`` (as `launch_args.given_flags()` returns them) as command-line words."""
    argv: list[str] = []
    for option in OPTIONS:
        if option.dest not in flags:
            continue
        value = flags[option.dest]
        if option.kind == "switch":
            if value:
                argv.append(f"--{option.dest}")
        elif option.append:
            for item in value:
                argv += [f"--{option.dest}", str(item)]
        else:
            argv += [f"--{option.dest}", str(value)]
    return argv


def reference_argv(
    plan: Any, reference: str, flags: Mapping[str, Any], config_path: str, data_parallel: int | None = None
) -> list[str]:
    """The launch flags of the reference run of a requested launch ``plan``.

    ``ddp``: plain data parallelism on as many processes as the requested run has data-parallel ranks
    (``data_parallel``, as its record says: tensor, context and pipeline peers read the same batches, so
    ``tp 2`` on 4 processes is compared with DDP on 2; ``None``: every process). ``single``: one process
    that accumulates gradients over that many micro-batches. Both keep the requested mixed precision,
    CPU choice, port and threads; ``config_path`` is an empty config file, so that the default config
    file (which may choose FSDP) is not read.

    Raises:
        VerifyError: an unknown reference, or a launch over several machines.
    """
    if reference not in REFERENCES:
        raise VerifyError(f"unknown reference {reference!r}: choose one of {', '.join(REFERENCES)}")
    if plan.num_machines != 1:
        raise VerifyError(f"accel verify runs on one machine; the launch asks for {plan.num_machines} machines")
    processes = (data_parallel or plan.num_processes) if reference == "ddp" else 1
    argv = ["--config_file", config_path, "--num_processes", str(processes)]
    argv += ["--mixed_precision", str(plan.values.get("mixed_precision") or "no")]
    if str(plan.env.get("ACCELERATE_USE_CPU", "")).lower() == "true" or flags.get("cpu"):
        argv.append("--cpu")
    for name in ("main_process_port", "num_cpu_threads_per_process", "module", "no_python"):
        if name in flags:
            argv += flags_to_argv({name: flags[name]})
    return argv


def reference_env(
    environ: Mapping[str, str], plan: Any, reference: str, data_parallel: int | None = None
) -> dict[str, str]:
    """The environment of the reference run: the user's, without the variables that choose a layout; for
    ``single``, gradient accumulation over the requested run's data-parallel ranks (``data_parallel``;
    ``None``: its process count)."""
    env = {key: value for key, value in environ.items() if not key.startswith(_LAYOUT_PREFIXES)}
    if reference == "single":
        steps = int(environ.get("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "1") or 1)
        env["ACCELERATE_GRADIENT_ACCUMULATION_STEPS"] = str(steps * (data_parallel or plan.num_processes))
    return env


def run_once(
    label: str,
    launch_argv: Sequence[str],
    script: Sequence[str],
    steps: int,
    folder: str,
    environ: Mapping[str, str],
) -> RunResult:
    """Launch ``script`` (the script and its arguments) with ``launch_argv`` for ``steps`` optimizer steps.

    Raises:
        VerifyError: the launch failed, or the script did not reach ``steps`` optimizer steps; the message
            says which and shows the end of the run's output.
    """
    record_path = os.path.join(folder, f"{label}.json")
    log_path = os.path.join(folder, f"{label}.log")
    env = {**environ, RECORD_VAR: record_path, STEPS_VAR: str(steps), "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "accel_launch.commands.launch", *launch_argv, *script]
    with open(log_path, "w", encoding="utf-8") as log:
        code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env, check=False).returncode
    record = _read(record_path)
    if code != 0:
        raise VerifyError(f"the {label} run failed (exit status {code}){_tail(log_path)}")
    return RunResult(
        label, _check_record(record, label, steps, log_path), record_path + ".params.pt", log_path, list(launch_argv)
    )


def _read(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return dict(json.load(handle))
    except (OSError, ValueError):
        return None


def _check_record(record: dict[str, Any] | None, label: str, steps: int, log_path: str) -> dict[str, Any]:
    if record is None:
        raise VerifyError(
            f"the {label} run ended without creating an Accelerator, so nothing was recorded (its output: {log_path})"
        )
    if record.get("backward_calls", 0) == 0:
        raise VerifyError(
            f"the {label} run never called accelerator.backward(loss): accel verify records the loss given "
            f"to it (call accelerator.backward instead of loss.backward; its output: {log_path})"
        )
    if not record.get("complete"):
        done = int(record.get("first_step") or 1) - 1 + len(record.get("steps", ()))
        raise VerifyError(
            f"the {label} run ended after {done} of the {steps} optimizer steps asked for: give a smaller "
            f"--steps or more data (its output: {log_path})"
        )
    return record


def _tail(log_path: str) -> str:
    try:
        with open(log_path, encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return ""
    if not lines:
        return ""
    shown = "\n    ".join(lines[-_TAIL_LINES:])
    return f"; its output ended with (whole log: {log_path}):\n    {shown}"
