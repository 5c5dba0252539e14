"""The text `accel verify` prints: the tolerance, a table of the steps, then one line per first divergence
(and the same for the resumed run of ``--resume-at``)."""

from __future__ import annotations

from accel_launch.verify.compare import QUANTITIES, Comparison


def _cell(value: tuple[float | None, float | None, bool | None]) -> str:
    run, reference, agrees = value
    if agrees is None:
        return "not recorded"
    mark = "=" if agrees else "!="
    return f"{run:.6g} {mark} {reference:.6g}"


def format_report(
    comparison: Comparison, run_label: str, reference_label: str, resume: tuple[Comparison, str] | None = None
) -> str:
    """The whole report of ``comparison`` (``run_label`` / ``reference_label`` say what ran); with
    ``resume`` (the resumed run's comparison and what it was), a second table: the resumed run against
    the uninterrupted one, its divergences on lines that start with ``resume:``."""
    lines = [
        f"accel verify: run: {run_label}",
        f"accel verify: reference: {reference_label}",
        f"accel verify: tolerance: {comparison.tolerance.describe()}",
    ]
    lines += _section(comparison, "run vs reference")
    agree = comparison.agree
    if resume is not None:
        resumed, label = resume
        lines.append(f"accel verify: resumed: {label}")
        lines += [f"resume: {line}" for line in _section(resumed, "resumed vs uninterrupted")]
        agree = agree and resumed.agree
    lines.append("accel verify: the runs agree" if agree else "accel verify: the runs differ")
    return "\n".join(lines)


def _section(comparison: Comparison, columns: str) -> list[str]:
    """The table of the steps, the parameters line, the notes and the first divergences of ``comparison``."""
    lines: list[str] = []
    header = ["step", *(f"{name} ({columns})" for _, name in QUANTITIES)]
    table = [header]
    for row in comparison.rows:
        table.append([str(row["step"]), *(_cell(row[key]) for key, _ in QUANTITIES)])
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    for line in table:
        lines.append(
            "  ".join(
                cell.rjust(width) if i == 0 else cell.ljust(width) for i, (cell, width) in enumerate(zip(line, widths))
            ).rstrip()
        )
    if comparison.parameter_diffs:
        worst = max(comparison.parameter_diffs.values())
        lines.append(
            f"parameters after step {comparison.rows[-1]['step'] if comparison.rows else 0}: {len(comparison.parameter_diffs)} tensors, "
            f"largest |diff| {worst:.3g}"
        )
    lines.extend(f"note: {note}" for note in comparison.notes)
    lines.extend(divergence.line(comparison.against) for divergence in comparison.divergences)
    return lines
