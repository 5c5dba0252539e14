"""``accel verify --resume-at K``: the resumed launch and its comparison with the uninterrupted run.

The requested run saves its state after step ``K`` (the recorder does, into ``<work folder>/resume``)
and goes on to step ``N``. A third launch of the same configuration resumes from that state and records
steps ``K+1 .. N``, which must equal the requested run's: a resume that loses the optimizer's or the
scheduler's state, the random states or the data position shows at step ``K+1`` (or later). By default
the recorder resumes for the script (``ACCEL_VERIFY_RESUME=recorder``); with ``--resume-args`` the
script resumes by itself, given those extra arguments (``{checkpoint}`` and ``{step}`` filled in).
Pure logic except `resume_launch_args`, which reads the resume point the requested run left.
"""

from __future__ import annotations

import json
import os
import shlex

from accel_launch.verify.runs import VerifyError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from accel_launch.verify.compare import Comparison, Tolerance

#: Read by `accel_train.verify_recorder`: save after this step (the requested run).
SAVE_AT_VAR = "ACCEL_VERIFY_SAVE_AT"
#: The folder of the resume point (the state and the loader positions).
RESUME_DIR_VAR = "ACCEL_VERIFY_RESUME_DIR"
#: The resumed run: ``recorder`` (the recorder loads the state) or ``script`` (the script does).
RESUME_VAR = "ACCEL_VERIFY_RESUME"
#: What ``--resume-args`` may name: the checkpoint folder and the step it was saved after.
PLACEHOLDERS = ("{checkpoint}", "{step}")


def check_resume_options(resume_at: int | None, steps: int, resume_args: str | None) -> None:
    """Refuse ``--resume-at`` / ``--resume-args`` that cannot work (`VerifyError` naming the option).

    ``K`` must leave at least one step to compare after the resume: ``1 <= K < steps``.
    """
    if resume_at is None:
        if resume_args is not None:
            raise VerifyError("--resume-args needs --resume-at K: it gives the script's arguments for the resumed run")
        return
    if not 1 <= resume_at < steps:
        raise VerifyError(
            f"--resume-at must be a step from 1 to {steps - 1} (before the last of --steps {steps}), got {resume_at}"
        )
    if resume_args is not None:
        try:
            shlex.split(resume_args)
        except ValueError as error:
            raise VerifyError(f"--resume-args {resume_args!r} cannot be split into arguments: {error}") from None


def requested_env(resume_at: int, resume_dir: str) -> dict[str, str]:
    """The variables that make the requested run save after step ``resume_at`` into ``resume_dir``."""
    return {SAVE_AT_VAR: str(resume_at), RESUME_DIR_VAR: resume_dir}


def resume_launch_args(resume_dir: str, resume_args: str | None) -> tuple[dict[str, str], list[str]]:
    """The environment and extra script arguments of the resumed run.

    Raises:
        VerifyError: the requested run left no resume point in ``resume_dir``.
    """
    env = {RESUME_DIR_VAR: resume_dir, RESUME_VAR: "recorder" if resume_args is None else "script"}
    if resume_args is None:
        return env, []
    point = _read_point(resume_dir)
    values = {"{checkpoint}": str(point["checkpoint"]), "{step}": str(point["step"])}
    words = []
    for word in shlex.split(resume_args):
        for name, value in values.items():
            word = word.replace(name, value)
        words.append(word)
    return env, words


def _read_point(resume_dir: str) -> dict[str, Any]:
    path = os.path.join(resume_dir, "resume.json")
    try:
        with open(path, encoding="utf-8") as handle:
            return dict(json.load(handle))
    except (OSError, ValueError):
        raise VerifyError(
            f"the requested run left no resume point ({path}): it did not save after the step given by --resume-at"
        ) from None


def compare_resumed(
    uninterrupted: Mapping[str, Any],
    resumed: Mapping[str, Any],
    uninterrupted_params: Mapping[str, Any],
    resumed_params: Mapping[str, Any],
    tolerance: Tolerance,
    resume_at: int,
    steps: int,
) -> Comparison:
    """Compare steps ``resume_at + 1 .. steps`` of the resumed run with the same steps of the uninterrupted
    one (the resumed run on the left, as the run, the uninterrupted one as the reference), then the final
    parameters."""
    from accel_launch.verify.compare import compare_parameters, compare_steps

    after = [step for step in uninterrupted.get("steps", ()) if step.get("step", 0) > resume_at]
    comparison = compare_steps(resumed, {"steps": after}, tolerance)
    comparison.against = "uninterrupted"
    compare_parameters(resumed_params, uninterrupted_params, tolerance, steps, comparison)
    return comparison
