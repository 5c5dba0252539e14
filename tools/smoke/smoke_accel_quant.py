"""accel-quant installed alone: it imports, and every public name resolves without an optional library."""

from __future__ import annotations

from _common import check, installed_distributions


def main() -> None:
    print("installed:", ", ".join(installed_distributions()))
    import accel_quant

    missing = [name for name in accel_quant.__all__ if not hasattr(accel_quant, name)]
    check(not missing, f"accel_quant names that do not resolve: {missing}")
    print(f"accel-quant smoke: {len(accel_quant.__all__)} public name(s) resolve OK")


if __name__ == "__main__":
    main()
