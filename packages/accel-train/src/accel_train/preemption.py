"""Saving on preemption: SIGTERM ends the run at the next step boundary, after a checkpoint.

Schedulers (SLURM, Kubernetes, cloud spot instances) announce a preemption with SIGTERM and kill the
job a little later. With ``ProjectConfiguration(save_on_preemption=True)`` the Accelerator installs a
handler that only records the request. At the start of the next step (``accelerator.accumulate``)
the processes agree (one all-reduce of a flag, so that all of them stop at the same step even when
the signal reached them at different moments), save a checkpoint, and exit with
`PREEMPTION_EXIT_CODE`. The next run resumes from that checkpoint with ``load_state()``.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType
from typing import Any

from accel_state.hangs import watched_collective

logger = logging.getLogger(__name__)

#: Exit status after a checkpoint taken on preemption: 128 + SIGTERM, what a shell reports for a
#: job ended by SIGTERM, and the value to give a scheduler's requeue rule (SLURM ``RequeueExit``,
#: a Kubernetes ``podFailurePolicy``).
PREEMPTION_EXIT_CODE = 128 + int(signal.SIGTERM)

PREEMPTION_SIGNALS = (signal.SIGTERM,)


class PreemptionWatch:
    """Records that this process was asked to stop (a signal handler that only sets a flag)."""

    def __init__(self, signals: tuple[signal.Signals, ...] = PREEMPTION_SIGNALS) -> None:
        self.signals = signals
        self.requested = False
        self.signal_name: str | None = None
        self._previous: dict[signal.Signals, Any] = {}

    def install(self) -> bool:
        """Install the handler; False (and nothing installed) outside the main thread, where Python
        cannot receive signals."""
        if threading.current_thread() is not threading.main_thread():
            logger.warning("save_on_preemption: not in the main thread, so SIGTERM cannot be watched")
            return False
        for sig in self.signals:
            if sig not in self._previous:
                self._previous[sig] = signal.signal(sig, self._handle)
        return True

    def uninstall(self) -> None:
        """Put back the handlers that were there before `install()`."""
        for sig, previous in self._previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
        self.signal_name = signal.Signals(signum).name


def agree(requested: bool, state: Any) -> bool:
    """True on every process when any process was asked to stop (an all-reduce of one flag)."""
    if state.num_processes <= 1:
        return requested
    return _agree(requested, state.device)


@watched_collective("check_preemption")
def _agree(requested: bool, device: Any) -> bool:
    import torch
    import torch.distributed as dist

    from accel_state.kept_works import wait_and_keep

    flag = torch.tensor([1 if requested else 0], dtype=torch.int32, device=device)
    wait_and_keep(dist.all_reduce(flag, op=dist.ReduceOp.MAX, async_op=True))
    return bool(flag.item())


def rewind_loader_state(state: dict[str, Any]) -> dict[str, Any]:
    """A data loader's state with its last batch not yet taken.

    The check happens when a step starts, after its batch was read; the checkpoint must hold the
    position before that batch, so the resumed run reads it again.
    """
    yielded = state.get("batches_yielded")
    if isinstance(yielded, int) and yielded > 0 and "stateful" not in state:
        return {**state, "batches_yielded": yielded - 1}
    return state
