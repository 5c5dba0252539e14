"""`accel verify`: prove that a launch configuration trains the same model as plain data parallelism.

The user's unchanged script runs twice through the real launcher for a few optimizer steps, once with
the requested configuration and once with a reference; the Accelerator of each run records the loss,
the gradient norm, the learning rate and the final parameters (`accel_train.verify_recorder`), and
`compare` finds the first step where they part. `verify()` is the Python entry point.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from accel_launch.verify.core import VerifyResult

__all__ = ["verify"]


def verify(
    script: str,
    script_args: Sequence[str] = (),
    launch_args: Sequence[str] = (),
    *,
    steps: int = 5,
    reference: str = "ddp",
    rtol: float | None = None,
    atol: float | None = None,
    json_path: str | None = None,
    resume_at: int | None = None,
    resume_args: str | None = None,
) -> VerifyResult:
    """Run ``accel verify`` from Python (a notebook, a test suite) and return its result.

    Args:
        script: the training script.
        script_args: its arguments.
        launch_args: ``accel launch`` options, as on the command line (``["--use_fsdp", "--num_processes", "2"]``).
        steps: optimizer steps to run and compare.
        reference: ``"ddp"`` (plain DDP, one process per data-parallel rank of the run) or ``"single"``.
        rtol: relative tolerance (``None``: by precision).
        atol: absolute tolerance (``None``: by precision).
        json_path: where to write the comparison and both records (``None``: nowhere).
        resume_at: also save after this step, resume in a third launch and compare the steps after it with
            the uninterrupted run (``None``: no resume check).
        resume_args: with ``resume_at``, the script resumes by itself given these extra arguments
            (``{checkpoint}``, ``{step}`` filled in); ``None``: the Accelerator loads the state for it.

    Returns:
        A `VerifyResult`: ``exit_code`` (0 agree, 1 differ, 2 a run failed or bad input), ``report``
        (the text the command prints), ``comparison`` and ``error``.
    """
    from accel_launch.commands.verify import verify_parser
    from accel_launch.verify.core import VerifyResult, verify_from_args

    argv = [*launch_args, "--steps", str(steps), "--reference", str(reference)]
    if rtol is not None:
        argv += ["--rtol", str(rtol)]
    if atol is not None:
        argv += ["--atol", str(atol)]
    if json_path is not None:
        argv += ["--json", str(json_path)]
    if resume_at is not None:
        argv += ["--resume-at", str(resume_at)]
    if resume_args is not None:
        argv += [f"--resume-args={resume_args}"]
    parser = verify_parser()
    try:
        args = parser.parse_args([*argv, script, *script_args])
    except SystemExit:
        return VerifyResult(
            2,
            f"accel verify: error: cannot parse the launch arguments {list(launch_args)}",
            error="bad launch arguments",
        )
    return verify_from_args(args)
