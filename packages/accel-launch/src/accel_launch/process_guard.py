"""Keeping a launch to itself: the workers die with the launcher, a one-machine store listens on
loopback only (the rendezvous store, and with c10d restarts each round's store of the workers), and
SIGUSR1 (SLURM's advance warning) stops the run as SIGTERM does.

Each piece is a context manager around torch.distributed.run called in the launcher's process: it
changes how that process creates the store and the worker processes for the length of the run only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from accel_launch.plan import LaunchPlan

_LOOPBACK_NAMES = (None, "", "localhost", "127.0.0.1")


def reserve_loopback_port(plan: LaunchPlan) -> socket.socket | None:
    """For a one-machine run through torch.distributed.run: a socket listening on ``127.0.0.1`` at the
    given port (or a free one), that the launcher's rendezvous store then serves on. None for any other run.

    The store then accepts no connection from another machine (torch's own store listens on every
    interface), and the port is held from the moment it is chosen, so no other program can take it
    between the choice and the start (the race of picking a free port and releasing it).

    Raises:
        ConnectionError: the given ``--main_process_port`` is already taken on this machine.
    """
    if plan.num_machines != 1 or plan.main_process_ip not in _LOOPBACK_NAMES:
        return None
    from accel_launch.commands_build import rendezvous_backend

    if rendezvous_backend(plan) not in ("static", "c10d"):
        return None
    port = int(plan.main_process_port or 0) if plan.port_given else 0
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # as servers do (torch's store too): a port another program just closed (TIME_WAIT) is free to take,
    # while one something listens on is still refused
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
        sock.listen(512)
    except OSError:
        sock.close()
        from accel_launch.runner import free_port

        raise ConnectionError(
            f"--main_process_port {port} is already in use on this machine; stop what listens on it "
            f"or pick another port (for example --main_process_port {free_port()})"
        ) from None
    return sock


@contextlib.contextmanager
def store_served_on(sock: socket.socket | None) -> Iterator[None]:
    """While the block runs, the rendezvous store torch creates as server on ``sock``'s port listens on
    ``sock`` (``TCPStore(master_listen_fd=...)``) instead of binding every interface itself."""
    if sock is None:
        yield
        return
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend

    base = dist.TCPStore
    port = int(sock.getsockname()[1])
    held = [sock]

    class LoopbackStore(base):  # type: ignore[misc, valid-type]
        def __init__(self, host_name: str, port_number: int, *args: Any, **kwargs: Any) -> None:
            is_master = args[1] if len(args) > 1 else kwargs.get("is_master", False)
            if is_master and int(port_number) == port and held and kwargs.get("master_listen_fd") is None:
                kwargs["master_listen_fd"] = held.pop().detach()
            super().__init__(host_name, port_number, *args, **kwargs)

    dist.TCPStore = LoopbackStore  # type: ignore[misc, assignment]
    c10d_rendezvous_backend.TCPStore = LoopbackStore  # type: ignore[misc, assignment]
    try:
        yield
    finally:
        dist.TCPStore = base  # type: ignore[misc]
        c10d_rendezvous_backend.TCPStore = base  # type: ignore[misc]
        for left in held:
            left.close()


@contextlib.contextmanager
def worker_stores_on_loopback(enabled: bool) -> Iterator[None]:
    """While the block runs, each rendezvous round's store of the workers is hosted by the launcher on
    ``127.0.0.1`` (a fresh one per round), instead of by worker rank 0 on every interface.

    For a one-machine c10d run with restarts, where ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` gives each
    round a store of its own (see ``commands_build.restart_environment``): torch would publish a free
    port and let worker rank 0 start a store there, listening on all interfaces. Here the launcher
    starts that round's store itself on a loopback socket and the workers connect to it as clients
    (``TORCHELASTIC_USE_AGENT_STORE=True``); the previous round's store is released when the next
    round begins.

    Args:
        enabled: False leaves torch as it is (several machines, another rendezvous, a shared store).
    """
    if not enabled:
        yield
        return
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous import api
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

    info = api.RendezvousStoreInfo
    base_build = info.__dict__["build"]
    base_flag = DynamicRendezvousHandler.__dict__["use_agent_store"]
    current: list[Any] = []

    def build(rank: int, store: Any, local_addr: str | None, server_port: int | None = None) -> Any:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(512)
        port = int(sock.getsockname()[1])
        server = dist.TCPStore(
            "127.0.0.1", port, is_master=True, wait_for_workers=False, master_listen_fd=sock.detach()
        )
        current[:] = [server]  # the previous round's store (its workers are gone) is released
        store.set(info.MASTER_ADDR_KEY, b"127.0.0.1")
        store.set(info.MASTER_PORT_KEY, str(port).encode())
        return info(master_addr="127.0.0.1", master_port=port)

    info.build = staticmethod(build)  # type: ignore[method-assign, assignment]
    DynamicRendezvousHandler.use_agent_store = property(lambda self: True)  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        info.build = base_build  # type: ignore[method-assign]
        DynamicRendezvousHandler.use_agent_store = base_flag  # type: ignore[method-assign]
        current.clear()


def parent_death_hook() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child die (SIGKILL) when this process dies, even by SIGKILL
    (Linux ``prctl(PR_SET_PDEATHSIG)``); None where the system has no such call."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def die_with_parent() -> None:
        prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the launcher died before the call: do not outlive it
            os._exit(1)

    return die_with_parent


class ParentDeathPrefix:
    """``setpriv --pdeathsig KILL --``: a command prefix that gives the command the parent-death signal
    before it starts (util-linux's ``setpriv``, one ``exec``), when this system's ``setpriv`` can do it.

    A prefix rather than a ``preexec_fn``: a ``preexec_fn`` makes Python fork the whole launcher (torch
    loaded) for each worker, 10-30 ms each, where a plain spawn takes 0.1 ms. Whether ``setpriv``
    knows ``--pdeathsig`` is checked by running it once; create the object early (it starts the check)
    and read `result()` when the workers start, so the check runs while torch is imported.
    """

    def __init__(self) -> None:
        import shutil
        import subprocess

        self._probe: subprocess.Popen | None = None
        self.prefix: list[str] | None = None
        setpriv = shutil.which("setpriv") if sys.platform.startswith("linux") else None
        if setpriv is None:
            return
        self.prefix = [setpriv, "--pdeathsig", "KILL", "--"]
        try:
            self._probe = subprocess.Popen([*self.prefix, "true"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except OSError:
            self.prefix = None

    def result(self) -> list[str] | None:
        """The prefix, or None where ``setpriv`` is missing or refused ``--pdeathsig``."""
        if self._probe is not None:
            try:
                works = self._probe.wait(timeout=10) == 0
            except Exception:
                self._probe.kill()
                works = False
            self._probe = None
            if not works:
                self.prefix = None
        return self.prefix


@contextlib.contextmanager
def workers_die_with_launcher(probe: ParentDeathPrefix | None = None) -> Iterator[None]:
    """While the block runs, the processes torch's elastic agent starts die when the launcher dies
    (even by SIGKILL, when nothing can forward a signal): no worker left running on its own.

    Each worker command is started through the `ParentDeathPrefix` (``probe``, started earlier,
    else now), or with `parent_death_hook()` as ``preexec_fn`` where ``setpriv`` cannot do it.
    """
    prefix = (probe or ParentDeathPrefix()).result()
    hook = None if prefix is not None else parent_death_hook()
    if prefix is None and hook is None:
        yield
        return
    from torch.distributed.elastic.multiprocessing.subprocess_handler import subprocess_handler

    base = subprocess_handler.Popen

    class DyingWithLauncher(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            if prefix is not None and "args" in kwargs:
                kwargs["args"] = (*prefix, *kwargs["args"])
            elif prefix is not None:
                args = ((*prefix, *args[0]), *args[1:])
            else:
                kwargs.setdefault("preexec_fn", hook)
            super().__init__(*args, **kwargs)

    subprocess_handler.Popen = DyingWithLauncher  # type: ignore[misc]
    try:
        yield
    finally:
        subprocess_handler.Popen = base  # type: ignore[misc]


def forward_signal(
    sig: signal.Signals, processes: Sequence[subprocess.Popen], as_signal: signal.Signals | None = None
) -> Any:
    """Pass ``sig`` on to each of ``processes`` still running (as ``as_signal`` when given) instead of
    dying and leaving them behind; the previous handler, or None outside the main thread (where Python
    allows no handler).

    Args:
        sig: the signal the launcher receives.
        processes: the launcher's children.
        as_signal: the signal they get instead (SIGUSR1 reaches them as SIGTERM).
    """
    if threading.current_thread() is not threading.main_thread():
        return None

    def forward(signum: int, frame: Any) -> None:
        for process in processes:
            if process.poll() is None:
                process.send_signal(as_signal or signum)

    return signal.signal(sig, forward)


@contextlib.contextmanager
def usr1_as_sigterm() -> Iterator[None]:
    """SIGUSR1 (what ``sbatch --signal=USR1@<seconds>`` sends before the time limit) to the launcher acts
    as SIGTERM: the workers are asked to stop (and save, with ``save_on_preemption``). Without this,
    SIGUSR1's default action would kill the launcher and leave the workers without a word."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def to_sigterm(signum: int, frame: Any) -> None:
        os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.signal(signal.SIGUSR1, to_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGUSR1, previous)
