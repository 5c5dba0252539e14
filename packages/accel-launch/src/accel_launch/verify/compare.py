"""Compare two `accel verify` records step by step: which quantities agree, and where they first part.

A record (written by `accel_train.verify_recorder` in each run) holds, per optimizer step, the loss
given to ``backward`` (averaged over the processes), the global gradient norm before the step and the
learning rate; after the last step, the full parameters. Two values agree when
``|run - reference| <= atol + rtol * |reference|`` (``numpy.isclose``'s rule, the reference on the
right). The default tolerances follow the precision: float32 runs differ only by the order of
reductions, bf16 and fp16 by their rounding. Pure logic: no process is started here, and torch is
needed only for the parameters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

#: Per-step quantities, in the order the table shows them: (record key, name in the report).
QUANTITIES: tuple[tuple[str, str], ...] = (("loss", "loss"), ("grad_norm", "grad norm"), ("lr", "learning rate"))

#: Default (rtol, atol) by the run's ``mixed_precision``.
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "no": (1e-4, 1e-6),
    "fp16": (5e-3, 1e-4),
    "bf16": (2e-2, 1e-3),
    "fp8": (1e-1, 1e-2),
}

_PRECISION_NAMES = {"no": "float32", "fp16": "fp16", "bf16": "bf16", "fp8": "fp8"}


@dataclass(frozen=True)
class Tolerance:
    """How close two values must be: ``|run - reference| <= atol + rtol * |reference|``.

    Args:
        rtol: relative tolerance (of the reference value).
        atol: absolute tolerance.
        source: where the numbers came from, for the report (``"float32 default"``, ``"--rtol/--atol"``).
    """

    rtol: float
    atol: float
    source: str

    def allows(self, run: float, reference: float) -> bool:
        """Whether ``run`` agrees with ``reference``."""
        return abs(run - reference) <= self.atol + self.rtol * abs(reference)

    def describe(self) -> str:
        """One line for the report: the numbers and where they came from."""
        return f"rtol={self.rtol:g}, atol={self.atol:g} ({self.source})"


def tolerance_for(mixed_precision: str, rtol: float | None = None, atol: float | None = None) -> Tolerance:
    """The tolerance of a run in ``mixed_precision``, with ``rtol`` / ``atol`` overriding the defaults.

    Raises:
        ValueError: an unknown precision, or a negative or non-finite tolerance.
    """
    precision = str(mixed_precision).lower()
    if precision not in DEFAULT_TOLERANCES:
        raise ValueError(
            f"no default tolerance for mixed precision {mixed_precision!r}: expected one of "
            f"{', '.join(DEFAULT_TOLERANCES)}"
        )
    default_rtol, default_atol = DEFAULT_TOLERANCES[precision]
    for name, value in (("--rtol", rtol), ("--atol", atol)):
        if value is not None and not (value >= 0 and value != float("inf")):
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    source = f"{_PRECISION_NAMES[precision]} default"
    overridden = [name for name, value in (("--rtol", rtol), ("--atol", atol)) if value is not None]
    if overridden:
        source = f"{'/'.join(overridden)} given, else {source}"
    return Tolerance(
        default_rtol if rtol is None else float(rtol), default_atol if atol is None else float(atol), source
    )


def looser_precision(*precisions: str | None) -> str:
    """Of the precisions the runs used (as their records say), the one with the loosest default tolerance.

    The precision a script gives ``Accelerator(mixed_precision=...)`` is not in the launch options, so the
    records, not the launch plan, say what the runs computed in. Unknown or missing names count as float32.
    """
    known = [str(p).lower() for p in precisions if p is not None and str(p).lower() in DEFAULT_TOLERANCES]
    return max(known, key=lambda name: DEFAULT_TOLERANCES[name], default="no")


@dataclass(frozen=True)
class Divergence:
    """The first place where the run and the reference disagree on one quantity.

    Args:
        step: the optimizer step (parameters: the last step).
        quantity: ``"loss"``, ``"grad norm"``, ``"learning rate"`` or ``"parameters"``.
        run: the run's value (parameters: the largest difference).
        reference: the reference's value (parameters: ``None``).
        detail: the rest of the sentence: the differing parameter, how many differ.
    """

    step: int
    quantity: str
    run: float | None
    reference: float | None
    detail: str = ""

    def line(self, against: str = "reference") -> str:
        """The report's line for this divergence (``against``: what the run was compared with)."""
        if self.quantity == "parameters":
            return f"first divergence: parameters after step {self.step}: {self.detail}"
        return (
            f"first divergence: {self.quantity} at step {self.step}: {_fmt(self.run)} vs {against} "
            f"{_fmt(self.reference)} (|diff| {_fmt(abs(_num(self.run) - _num(self.reference)))}){self.detail}"
        )


@dataclass
class Comparison:
    """The outcome of comparing a run with its reference.

    Args:
        tolerance: the tolerance used.
        rows: per step, ``{"step": n, <quantity>: (run, reference, agrees)}``.
        divergences: the first divergence of each quantity that diverges, by step.
        parameter_diffs: per parameter, the largest absolute difference after the last step.
        notes: what could not be compared and why.
        against: what the run was compared with, as the divergence lines name it.
    """

    tolerance: Tolerance
    rows: list[dict[str, Any]] = field(default_factory=list)
    divergences: list[Divergence] = field(default_factory=list)
    parameter_diffs: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    against: str = "reference"

    @property
    def agree(self) -> bool:
        """True when nothing diverges."""
        return not self.divergences

    def to_dict(self) -> dict[str, Any]:
        """The comparison as JSON-ready data (for ``--json``)."""
        return {
            "result": "agree" if self.agree else "differ",
            "tolerance": {"rtol": self.tolerance.rtol, "atol": self.tolerance.atol, "source": self.tolerance.source},
            "steps": [
                {
                    "step": row["step"],
                    **{key: dict(zip(("run", "reference", "agree"), row[key])) for key, _ in QUANTITIES},
                }
                for row in self.rows
            ],
            "divergences": [d.line(self.against) for d in self.divergences],
            "parameter_max_abs_diff": self.parameter_diffs,
            "notes": self.notes,
        }


#: The note of a script that steps an optimizer it never passed to ``prepare`` (the recorder follows it).
UNPREPARED_OPTIMIZER_NOTE = (
    "the script steps an optimizer it never passed to accelerator.prepare: under DDP it still holds the model's "
    "parameters, but FSDP, DeepSpeed and tensor parallelism give the prepared model new ones, which it never "
    "updates; pass it to prepare"
)


def compare_steps(run: Mapping[str, Any], reference: Mapping[str, Any], tolerance: Tolerance) -> Comparison:
    """Compare the per-step quantities of two records (the parameters: `compare_parameters()`)."""
    result = Comparison(tolerance)
    run_steps, ref_steps = list(run.get("steps", ())), list(reference.get("steps", ()))
    first: dict[str, Divergence] = {}
    skipped: set[str] = set()
    for run_step, ref_step in zip(run_steps, ref_steps):
        row: dict[str, Any] = {"step": run_step["step"]}
        for key, name in QUANTITIES:
            a, b = run_step.get(key), ref_step.get(key)
            if a is None or b is None:
                row[key] = (a, b, None)
                skipped.add(name)
                continue
            ok = tolerance.allows(a, b)
            row[key] = (a, b, ok)
            if not ok and key not in first:
                first[key] = Divergence(run_step["step"], name, a, b)
        result.rows.append(row)
    result.divergences = sorted(first.values(), key=lambda d: d.step)
    for name in sorted(skipped):
        result.notes.append(f"{name}: not recorded by one of the runs (fp16 scaler or DeepSpeed), not compared")
    if run.get("optimizer_prepared") is False or reference.get("optimizer_prepared") is False:
        result.notes.append(UNPREPARED_OPTIMIZER_NOTE)
    return result


def compare_parameters(
    run: Mapping[str, Any], reference: Mapping[str, Any], tolerance: Tolerance, step: int, comparison: Comparison
) -> None:
    """Compare the final parameters (``{name: tensor}``) of two runs; add a divergence to ``comparison``
    naming the parameter with the largest difference, or the names / shapes that do not match."""
    only_run = sorted(set(run) - set(reference))
    only_ref = sorted(set(reference) - set(run))
    if only_run or only_ref:
        parts = []
        if only_run:
            parts.append(f"only in the run: {_names(only_run)}")
        if only_ref:
            parts.append(f"only in the reference: {_names(only_ref)}")
        comparison.divergences.append(
            Divergence(step, "parameters", None, None, "the parameter names differ (" + "; ".join(parts) + ")")
        )
        return
    differing: list[tuple[float, str]] = []
    for name in sorted(run):
        a, b = run[name].float(), reference[name].float()
        if a.shape != b.shape:
            comparison.divergences.append(
                Divergence(
                    step, "parameters", None, None, f"{name} has shape {tuple(a.shape)} vs reference {tuple(b.shape)}"
                )
            )
            return
        diff = (a - b).abs()
        largest = float(diff.max()) if diff.numel() else 0.0
        comparison.parameter_diffs[name] = largest
        if diff.numel() and bool((diff > tolerance.atol + tolerance.rtol * b.abs()).any()):
            differing.append((largest, name))
    if differing:
        largest, name = max(differing)
        comparison.divergences.append(
            Divergence(
                step,
                "parameters",
                largest,
                None,
                f"{len(differing)} of {len(run)} tensors differ; largest difference in {name} "
                f"(max |diff| {_fmt(largest)})",
            )
        )


def _names(names: list[str], limit: int = 5) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _num(value: float | None) -> float:
    return float("nan") if value is None else float(value)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"
