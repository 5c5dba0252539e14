"""``accel launch --dry_run``: the resolved launch plan, and where each value came from, without starting it.

`plan_summary()` turns a `LaunchPlan` into plain data (each entry a value
and its source: a flag, the config file, a scheduler's variable, the launcher's own choice, a default);
`print_plan()` prints it as aligned text or, with ``--json``, as one JSON object for tools. The
port of a one-machine run without ``--main_process_port`` is picked when the run starts (a free one),
so the plan says so rather than naming a port that may be taken by then.
"""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

from accel_launch.options import BY_DEST
from accel_launch.plan import LaunchPlan

#: The launcher each mode uses, in words.
_LAUNCHERS = {
    "simple": "one child process",
    "copies": "independent child processes, no process group",
    "torchrun": "torch.distributed.run (elastic agent, in the launcher's process)",
    "deepspeed": "the deepspeed launcher",
    "mpirun": "mpirun",
    "tpu": "torch_xla spawn",
    "tpu_pod": "gcloud on every VM of the TPU pod",
    "sagemaker": "a SageMaker training job",
}

#: Collective backend each device type's processes start (as accel_state.devices picks it).
_BACKENDS = {"cpu": "gloo", "cuda": "nccl", "xpu": "xccl", "npu": "hccl", "mlu": "cncl", "musa": "mccl", "hpu": "hccl"}

#: Training strategy -> the group of launch options that hold its settings.
_STRATEGY_GROUPS = {
    "DeepSpeed": "DeepSpeed Arguments",
    "FSDP": "Fully Sharded Data Parallelism Arguments",
    "Megatron-LM": "Megatron-LM Arguments",
    "ParallelismConfig": "ParallelismConfig Arguments",
}


def _entry(plan: LaunchPlan, name: str, value: Any = None) -> dict[str, Any]:
    return {"value": plan.values.get(name) if value is None else value, "source": plan.sources.get(name, "default")}


def strategy_of(plan: LaunchPlan) -> str:
    """The training strategy the plan asks for: DeepSpeed, FSDP, Megatron-LM, ParallelismConfig, DDP or none."""
    for flag, name in (
        ("use_deepspeed", "DeepSpeed"),
        ("use_fsdp", "FSDP"),
        ("use_megatron_lm", "Megatron-LM"),
        ("use_parallelism_config", "ParallelismConfig"),
    ):
        if plan.values.get(flag):
            return name
    return "DDP" if plan.num_processes > 1 else "none (one process)"


def _strategy_source(plan: LaunchPlan, strategy: str) -> str:
    flag = {
        "DeepSpeed": "use_deepspeed",
        "FSDP": "use_fsdp",
        "Megatron-LM": "use_megatron_lm",
        "ParallelismConfig": "use_parallelism_config",
    }.get(strategy)
    if flag is not None:
        return plan.sources.get(flag, "default")
    return plan.sources.get("num_processes", "default")


def plan_summary(plan: LaunchPlan) -> dict[str, Any]:
    """The plan as plain data: each setting ``{"value": ..., "source": ...}``.

    Args:
        plan: a resolved launch plan.

    Returns:
        ``mode``, ``launcher``, ``script``, ``script_args``, ``scheduler``, ``machines``, ``machine_rank``,
        ``num_processes``, ``processes_per_machine``, ``ranks_on_this_machine``, ``rendezvous``, ``backend``,
        ``mixed_precision``, ``strategy`` (its ``settings`` inside), ``environment`` (the variables the
        processes get) and ``warnings``.
    """
    per_machine = plan.nproc_per_node
    first = plan.machine_rank * per_machine
    port: Any = plan.main_process_port
    if not plan.port_given:
        port = 29500 if plan.num_machines > 1 else "a free port, picked at start"
    device = "cpu" if plan.values.get("cpu") else None
    strategy = strategy_of(plan)
    settings: dict[str, Any] = {}
    group = _STRATEGY_GROUPS.get(strategy)
    if group is not None:
        for name, option in BY_DEST.items():
            if option.group == group and plan.values.get(name) is not None:
                settings[name] = _entry(plan, name)
    if plan.mode == "torchrun":
        from accel_launch.commands_build import rendezvous_backend

        rdzv = rendezvous_backend(plan)
    else:
        rdzv = None
    return {
        "mode": plan.mode,
        "launcher": _LAUNCHERS.get(plan.mode, plan.mode),
        "script": plan.training_script,
        "script_args": list(plan.training_script_args),
        "scheduler": plan.scheduler,
        "machines": _entry(plan, "num_machines", plan.num_machines),
        "machine_rank": _entry(plan, "machine_rank", plan.machine_rank),
        "num_processes": _entry(plan, "num_processes", plan.num_processes),
        "processes_per_machine": per_machine,
        "ranks_on_this_machine": list(range(first, first + per_machine)),
        "rendezvous": {
            "backend": rdzv,
            "address": _entry(plan, "main_process_ip", plan.main_process_ip or "127.0.0.1"),
            "port": _entry(plan, "main_process_port", port),
        },
        "backend": _backend(plan, device),
        "mixed_precision": _entry(plan, "mixed_precision"),
        "strategy": {"value": strategy, "source": _strategy_source(plan, strategy), "settings": settings},
        "environment": dict(sorted(plan.env.items())),
        "warnings": list(plan.warnings),
    }


def _backend(plan: LaunchPlan, device: str | None) -> dict[str, str]:
    """The collective backend the processes start, and what chose it."""
    if plan.values.get("_independent"):
        return {"value": "none (each process on its own)", "source": plan.sources.get("cpu", "default")}
    if device == "cpu":
        return {"value": _BACKENDS["cpu"], "source": plan.sources.get("cpu", "default")}
    return {"value": "the default of the device each process finds", "source": "chosen by each process"}


def _line(out: TextIO, label: str, value: Any, source: str | None = None, indent: int = 2) -> None:
    text = f"{' ' * indent}{label + ':':<{24 - indent}} {value}"
    if source:
        text = f"{text:<58} [{source}]"
    out.write(text.rstrip() + "\n")


def format_plan(summary: dict[str, Any], out: TextIO) -> None:
    """Write ``summary`` (from `plan_summary()`) as aligned text, one setting a line with its source."""
    out.write("accel launch plan (dry run: nothing was started)\n")
    _line(out, "script", " ".join([summary["script"], *summary["script_args"]]))
    _line(out, "launcher", f"{summary['launcher']} (mode {summary['mode']})")
    if summary["scheduler"]:
        _line(out, "scheduler", summary["scheduler"])
    for key, label in (("machines", "machines"), ("machine_rank", "machine rank"), ("num_processes", "processes")):
        _line(out, label, summary[key]["value"], summary[key]["source"])
    _line(out, "per machine", summary["processes_per_machine"])
    ranks = summary["ranks_on_this_machine"]
    _line(out, "ranks here", f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 else ranks[0])
    rdzv = summary["rendezvous"]
    if rdzv["backend"]:
        _line(out, "rendezvous", rdzv["backend"])
    _line(out, "main process ip", rdzv["address"]["value"], rdzv["address"]["source"])
    _line(out, "main process port", rdzv["port"]["value"], rdzv["port"]["source"])
    _line(out, "backend", summary["backend"]["value"], summary["backend"]["source"])
    _line(out, "mixed precision", summary["mixed_precision"]["value"], summary["mixed_precision"]["source"])
    strategy = summary["strategy"]
    _line(out, "strategy", strategy["value"], strategy["source"])
    for name, entry in strategy["settings"].items():
        _line(out, name, entry["value"], entry["source"], indent=4)
    out.write("  environment of the processes:\n")
    for key, value in summary["environment"].items():
        out.write(f"    {key}={value}\n")
    for warning in summary["warnings"]:
        out.write(f"  warning: {warning}\n")


def print_plan(plan: LaunchPlan, as_json: bool = False, out: TextIO | None = None) -> None:
    """Print the plan of ``plan`` to ``out`` (stdout): text, or JSON with ``as_json``."""
    out = out or sys.stdout
    summary = plan_summary(plan)
    if as_json:
        out.write(json.dumps(summary, indent=2, default=str) + "\n")
    else:
        format_plan(summary, out)
