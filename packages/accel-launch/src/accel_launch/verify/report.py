"""The text `accel verify` prints: the tolerance, a table of the steps, then one line per first divergence."""

from __future__ import annotations

from accel_launch.verify.compare import QUANTITIES, Comparison


def _cell(value: tuple[float | None, float | None, bool | None]) -> str:
    run, reference, agrees = value
    if agrees is None:
        return "not recorded"
    mark = "=" if agrees else "!="
    return f"{run:.6g} {mark} {reference:.6g}"


def format_report(comparison: Comparison, run_label: str, reference_label: str) -> str:
    """The whole report of ``comparison`` (``run_label`` / ``reference_label`` say what ran)."""
    lines = [
        f"accel verify: run: {run_label}",
        f"accel verify: reference: {reference_label}",
        f"accel verify: tolerance: {comparison.tolerance.describe()}",
    ]
    header = ["step", *(f"{name} (run vs reference)" for _, name in QUANTITIES)]
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
            f"parameters after step {len(comparison.rows)}: {len(comparison.parameter_diffs)} tensors, "
            f"largest |diff| {worst:.3g}"
        )
    lines.extend(f"note: {note}" for note in comparison.notes)
    lines.extend(divergence.line() for divergence in comparison.divergences)
    lines.append("accel verify: the runs agree" if comparison.agree else "accel verify: the runs differ")
    return "\n".join(lines)
