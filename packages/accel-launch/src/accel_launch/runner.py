"""Starting the processes of a launch plan (the part of ``accel launch`` that talks to the system).

Multi-process and multi-machine runs go through ``torch.distributed.run``, called in this process
(no extra interpreter); DeepSpeed multi-node runs through DeepSpeed's own launcher; one process is a
plain child process, and so is each of the independent processes of ``--multi_gpu`` without a GPU
(`accel_launch.copies`). Checks that fail fast come first: a missing script, a port already taken.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from accel_launch.commands_build import (
    deepspeed_command,
    deepspeed_env_file_lines,
    mpirun_command,
    rendezvous_backend,
    restart_environment,
    script_command,
    torchrun_args,
)
from accel_launch.copies import run_copies
from accel_launch.plan import LaunchPlan
from accel_launch.process_guard import (
    ParentDeathPrefix,
    forward_signal,
    parent_death_hook,
    reserve_loopback_port,
    store_served_on,
    usr1_as_sigterm,
    worker_stores_on_loopback,
    workers_die_with_launcher,
)
from accel_launch.values import ConfigError
from accel_state.install_hints import install_hint

#: Exit status of a launch stopped by SIGTERM (128 + 15, as a shell reports it): what a scheduler's
#: requeue rule matches (SLURM ``RequeueExit``, a Kubernetes ``podFailurePolicy``).
TERMINATED_EXIT_CODE = 128 + int(signal.SIGTERM)


class LaunchError(ValueError):
    """A launch that cannot start; the message says why and what to do.

    A ``ValueError``, as the documented ``launch_command`` raises for arguments it cannot use; a missing
    script is a ``FileNotFoundError`` and a main port already taken a ``ConnectionError``.
    """


def is_port_in_use(port: int | None = None, host: str = "127.0.0.1") -> bool:
    """True when something already listens on ``port`` (29500 by default) of ``host``.

    Args:
        port: The port; `None` uses 29500.
        host: The host to probe.
    """
    port = port or 29500
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((host, port)) == 0 or not _can_bind(port)


def _can_bind(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port nobody listens on right now (free at once for any program, as the documented helper's)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def check_script(plan: LaunchPlan) -> None:
    """Error when the script to launch does not exist (a module or program is found at run time)."""
    if plan.values.get("module"):
        return
    script = plan.training_script
    if plan.values.get("no_python"):
        if (os.sep in script and not Path(script).exists()) or (os.sep not in script and shutil.which(script) is None):
            raise FileNotFoundError(f"the program {script!r} was not found (with --no_python it must be an executable)")
        return
    if not Path(script).is_file():
        hint = " (to run a module, add -m)" if "." in script and not script.endswith(".py") else ""
        raise FileNotFoundError(f"the training script {script!r} was not found{hint}")


def choose_port(plan: LaunchPlan) -> int:
    """The main process port: the given one (an error if already taken on the main machine), else a free
    one (also for ``--main_process_port 0``)."""
    if plan.port_given:
        port = int(plan.main_process_port or 0)
        if plan.machine_rank == 0 and _is_local(plan.main_process_ip) and is_port_in_use(port):
            raise ConnectionError(
                f"--main_process_port {port} is already in use on this machine; stop what listens on it "
                f"or pick another port (for example --main_process_port {free_port()})"
            )
        return port
    if plan.num_machines > 1:
        return 29500
    return free_port()


def _is_local(host: str | None) -> bool:
    if host in (None, "", "localhost", "127.0.0.1", "0.0.0.0", "::1"):
        return True
    try:
        local = {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None)}
    except OSError:
        local = set()
    return host in local


def launch_env(plan: LaunchPlan, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The plan's variables, minus those the user already exported (in ``environ``, ``os.environ`` by
    default) where no flag and no config key chose a value: an exported ``ACCELERATE_DEBUG_MODE=1`` or
    ``OMP_NUM_THREADS`` is kept rather than overwritten by a launcher default."""
    environ = os.environ if environ is None else environ
    env = dict(plan.env)
    if plan.values.get("num_cpu_threads_per_process") is None and environ.get("OMP_NUM_THREADS"):
        env.pop("OMP_NUM_THREADS", None)
    for key in plan.defaulted_env:
        if environ.get(key):
            env.pop(key, None)
    return env


def _child_env(plan: LaunchPlan) -> dict[str, str]:
    env = dict(os.environ)
    env.update(launch_env(plan))
    return env


def run_simple(plan: LaunchPlan) -> int:
    """One process: run the script as a child with the plan's environment; its exit code is ours."""
    cmd = script_command(plan)
    try:
        process = subprocess.Popen(cmd, env=_child_env(plan), preexec_fn=parent_death_hook())
    except FileNotFoundError as error:
        raise LaunchError(f"cannot start {cmd[0]!r}: {error}") from None
    previous = forward_signal(signal.SIGTERM, [process])
    previous_usr1 = forward_signal(signal.SIGUSR1, [process], as_signal=signal.SIGTERM)
    try:
        code = process.wait()
    except KeyboardInterrupt:
        process.terminate()
        code = process.wait()
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if previous_usr1 is not None:
            signal.signal(signal.SIGUSR1, previous_usr1)
    if code == -signal.SIGTERM:
        code = TERMINATED_EXIT_CODE
    if code != 0 and not plan.values.get("quiet"):
        print(f"accel launch: {' '.join(cmd)} exited with code {code}", file=sys.stderr)
    return code


def run_independent(plan: LaunchPlan) -> int:
    """``copies`` mode: the processes of this machine, each on its own (no process group); the status of
    the first that failed, or 0."""
    cmd = script_command(plan)
    try:
        code, failed = run_copies(cmd, _child_env(plan), plan.nproc_per_node)
    except FileNotFoundError as error:
        raise LaunchError(f"cannot start {cmd[0]!r}: {error}") from None
    if code == -signal.SIGTERM:
        code = TERMINATED_EXIT_CODE
    if code != 0 and not plan.values.get("quiet"):
        print(
            f"accel launch: process {failed} of {plan.nproc_per_node} ({' '.join(cmd)}) exited with code {code}; "
            "the others were stopped",
            file=sys.stderr,
        )
    return code


def requeue_if_asked(plan: LaunchPlan, code: int, environ: Mapping[str, str] | None = None) -> None:
    """With ``--requeue_on_preemption``, after a run stopped on request (status 143) in a SLURM job:
    ``scontrol requeue $SLURM_JOB_ID``, from machine rank 0 only (one requeue per job).

    The job comes back with the same id and the same command; the script resumes from the checkpoint
    the preemption save wrote. A failure to requeue is reported, the exit status stays 143.
    """
    from accel_state.cluster import requeue_command

    if code != TERMINATED_EXIT_CODE or not plan.values.get("requeue_on_preemption") or plan.machine_rank != 0:
        return
    environ = os.environ if environ is None else environ
    command = requeue_command(environ)
    if command is None:
        print(
            "accel launch: --requeue_on_preemption: not in a SLURM job (no SLURM_JOB_ID), nothing requeued",
            file=sys.stderr,
        )
        return
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        print(f"accel launch: could not requeue the job ({' '.join(command)}): {error}", file=sys.stderr)
        return
    if done.returncode != 0:
        print(
            f"accel launch: `{' '.join(command)}` failed (status {done.returncode}): {done.stderr.strip()}",
            file=sys.stderr,
        )
        return
    print(f"accel launch: preempted; job requeued ({' '.join(command)})", file=sys.stderr)


def run_torchrun(plan: LaunchPlan, port: int, store_socket: socket.socket | None = None) -> int:
    """Several processes (or machines) through torch.distributed.run, in this process.

    SIGTERM to the launcher (a scheduler preempting the job) is passed on to the workers by the
    elastic agent, which gives them 30 s to finish (and save, with ``save_on_preemption``); the
    launcher then exits with status 143. Workers that exit with 143 themselves give the same status.
    """
    probe = ParentDeathPrefix()  # checked while torch is imported below
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    args = get_args_parser().parse_args(torchrun_args(plan, port))
    os.environ.update(launch_env(plan))
    for key, value in restart_environment(plan).items():
        os.environ.setdefault(key, value)
    try:
        per_round_loopback = (
            store_socket is not None
            and rendezvous_backend(plan) == "c10d"
            and os.environ.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE") == "1"
        )
        with (
            store_served_on(store_socket),
            worker_stores_on_loopback(per_round_loopback),
            workers_die_with_launcher(probe),
            usr1_as_sigterm(),
        ):
            run(args)
    except SignalException as error:
        if not plan.values.get("quiet"):
            print(
                f"accel launch: stopped by {signal.Signals(error.sigval).name}; the workers were asked to stop "
                f"(exit status {TERMINATED_EXIT_CODE})",
                file=sys.stderr,
            )
        return TERMINATED_EXIT_CODE
    except ChildFailedError as error:
        if plan.values.get("debug"):
            raise
        failures = error.failures
        if failures and all(failure.exitcode == TERMINATED_EXIT_CODE for failure in failures.values()):
            if not plan.values.get("quiet"):
                print(
                    f"accel launch: the workers stopped on request (status {TERMINATED_EXIT_CODE}, preempted)",
                    file=sys.stderr,
                )
            return TERMINATED_EXIT_CODE
        if not plan.values.get("quiet"):
            print(f"accel launch: {failure_summary(failures)} (see its output above)", file=sys.stderr)
        return 1
    return 0


def failure_summary(failures: Mapping[int, Any]) -> str:
    """Which rank failed first, and which were only stopped because of it.

    When one worker fails, the elastic agent stops the others with SIGTERM, so they are reported as
    failed too. The first failure is the earliest one that was not a stop signal (ties: the order the
    agent saw them); the stopped ranks are named apart.

    Args:
        failures: global rank -> ``ProcessFailure`` (``exitcode``, ``timestamp``), as ``ChildFailedError`` holds them.

    Returns:
        ``rank 1 failed first (exit code 1); rank 0 was stopped by the launcher`` or the like.
    """
    stops = {-int(signal.SIGTERM), -int(signal.SIGINT)}  # what the agent sends the others
    order = {rank: index for index, rank in enumerate(failures)}
    own = [rank for rank, failure in failures.items() if failure.exitcode not in stops]
    candidates = own or list(failures)
    first = min(candidates, key=lambda rank: (failures[rank].timestamp, order[rank]))
    code = failures[first].exitcode
    how = (
        f"killed by {signal.Signals(-code).name}"
        if code < 0 and -code in signal.valid_signals()
        else f"exit code {code}"
    )
    text = f"rank {first} failed first ({how})"
    others = sorted(rank for rank in failures if rank != first)
    stopped = [rank for rank in others if rank not in own]
    failed = [rank for rank in others if rank in own]
    if failed:
        text += f"; rank {', '.join(map(str, failed))} failed too"
    if stopped:
        text += (
            f"; rank {', '.join(map(str, stopped))} {'was' if len(stopped) == 1 else 'were'} stopped by the launcher"
        )
    return text


def run_deepspeed(plan: LaunchPlan, port: int) -> int:
    """A multi-node DeepSpeed run through the ``deepspeed`` launcher (pdsh and friends)."""
    from accel_launch import launch_utils  # its `which` is what tests patch

    cmd = deepspeed_command(plan, port)
    if launch_utils.which("deepspeed") is None:
        raise LaunchError(
            f"a multi-node DeepSpeed run needs the `deepspeed` launcher: {install_hint('accel-train', 'deepspeed')}"
        )
    env = _child_env(plan)
    if (plan.values.get("deepspeed_multinode_launcher") or "pdsh") == "pdsh":
        Path(".deepspeed_env").write_text("\n".join(deepspeed_env_file_lines(launch_env(plan))) + "\n")
    return subprocess.run(cmd, env=env, check=False).returncode


def run_mpirun(plan: LaunchPlan) -> int:
    """A multi-CPU run started by ``mpirun`` on the hosts of the hostfile."""
    from accel_launch import launch_utils  # its `which` and `subprocess` are what tests patch

    try:
        spelling = launch_utils.mpirun_spelling()
    except OSError as error:
        raise LaunchError(f"--mpirun_hostfile: {error}") from None
    env = _child_env(plan)
    env.setdefault("MASTER_ADDR", plan.main_process_ip or "127.0.0.1")
    env.setdefault("MASTER_PORT", str(plan.main_process_port or 29500))
    command = [*mpirun_command(plan, spelling), *script_command(plan)]
    return launch_utils.subprocess.run(command, env=env, check=False).returncode


def run_tpu(plan: LaunchPlan) -> int:
    """A TPU run: the script's main function spawned on every TPU core by torch_xla."""
    from accel_state.imports import is_torch_xla_available

    if not is_torch_xla_available():
        raise LaunchError("--tpu needs torch_xla installed (see https://github.com/pytorch/xla)")
    import importlib.util

    import torch_xla.distributed.xla_multiprocessing as xmp

    from accel_launch.launch_utils import PrepareForLaunch

    os.environ.update(launch_env(plan))
    path = Path(plan.training_script)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.path.insert(0, str(path.parent.resolve()))
    sys.argv = [str(path), *plan.training_script_args]
    # registered under its name, so that torch_xla's spawn can pickle the main function by reference
    sys.modules[spec.name] = module  # type: ignore[union-attr]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    name = plan.values["main_training_function"]
    function = getattr(module, name, None)
    if function is None:
        raise LaunchError(f"the script {path} has no function {name!r} (set --main_training_function)")
    xmp.spawn(PrepareForLaunch(function, distributed_type="XLA"), args=())
    return 0


def run_tpu_pod(plan: LaunchPlan) -> int:
    """A TPU pod run: the same ``accel launch`` started on every VM of the pod through gcloud."""
    from accel_launch.commands.tpu import tpu_pod_launch_command

    cmd = tpu_pod_launch_command(plan)
    if plan.values.get("debug"):
        print(" ".join(cmd))
        return 0
    return subprocess.run(cmd, check=False).returncode


def run_sagemaker(plan: LaunchPlan) -> int:
    """A SageMaker training job: the estimator built from the config, then fitted."""
    from accel_launch.sagemaker import sagemaker_launch

    return sagemaker_launch(plan)


def execute(plan: LaunchPlan) -> int:
    """Start the processes of ``plan`` and wait for them; the exit status of the run."""
    if plan.mode not in ("sagemaker", "tpu_pod"):
        check_script(plan)
    if plan.mode == "simple":
        code = run_simple(plan)
        requeue_if_asked(plan, code)
        return code
    if plan.mode == "copies":
        code = run_independent(plan)
        requeue_if_asked(plan, code)
        return code
    if plan.mode == "torchrun":
        sock = reserve_loopback_port(plan)
        if sock is not None:
            code = run_torchrun(plan, int(sock.getsockname()[1]), sock)
        else:
            code = run_torchrun(plan, choose_port(plan))
        requeue_if_asked(plan, code)
        return code
    if plan.mode == "deepspeed":
        return run_deepspeed(plan, choose_port(plan))
    if plan.mode == "mpirun":
        return run_mpirun(plan)
    if plan.mode == "tpu":
        return run_tpu(plan)
    if plan.mode == "tpu_pod":
        return run_tpu_pod(plan)
    if plan.mode == "sagemaker":
        return run_sagemaker(plan)
    raise ConfigError(f"unknown launch mode {plan.mode!r}")
