"""How far the client cases' figures move when the CPU's kernels change (issue 34): runs each case of
integration_tests/clients/cases.py on accel with this interpreter, once as this machine runs it and once
with other CPUs' kernels forced (ATen's portable kernels, MKL limited to SSE4.2, oneDNN to SSE4.1), and
prints the largest deviation of each kind from the recorded reference figures and between the two runs,
beside the tolerance of compare.py. Run it in the clients venv (``nox -s clients`` makes one):

    .nox/clients/bin/python tools/client_figure_spread.py [--cases NAME ...] [--jobs 2]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import pathlib
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "integration_tests" / "clients"))

import cases  # noqa: E402
import compare  # noqa: E402

#: Settings that make this CPU run the kernels another CPU would: other vector widths, other BLAS blocking.
OTHER_KERNELS = {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ONEDNN_MAX_CPU_ISA": "SSE41"}


def measure(case: cases.Case, work: pathlib.Path) -> dict[str, dict[str, float]]:
    """The case run natively and with other kernels; the largest deviations of each pair."""
    native = cases.run(case, sys.executable, work / "native", on_accel=True, timeout=1800)
    other = cases.run(case, sys.executable, work / "other", on_accel=True, timeout=1800, env=OTHER_KERNELS)
    record = json.loads((cases.REFERENCE / f"{case.name}.json").read_text())["figures"]
    return {
        "native vs reference": compare.spread(native, record, case.tolerance),
        "other kernels vs reference": compare.spread(other, record, case.tolerance),
        "native vs other kernels": compare.spread(native, other, case.tolerance),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="*", default=[case.name for case in cases.CASES])
    parser.add_argument("--jobs", type=int, default=2)
    options = parser.parse_args()
    chosen = [case for case in cases.CASES if case.name in options.cases]
    with tempfile.TemporaryDirectory() as scratch, concurrent.futures.ThreadPoolExecutor(options.jobs) as pool:
        futures = {case.name: pool.submit(measure, case, pathlib.Path(scratch) / case.name) for case in chosen}
        for case in chosen:
            tolerance = case.tolerance
            allowed = f"scalar {tolerance.scalar:g}, model {tolerance.model:g}, tensor {tolerance.tensor:g}"
            print(f"{case.name}  (allowed: {allowed})")
            for pair, largest in futures[case.name].result().items():
                print(f"    {pair:28s} " + "  ".join(f"{kind} {value:.3g}" for kind, value in largest.items()))


if __name__ == "__main__":
    main()
