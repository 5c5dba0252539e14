"""Record the reference figures of the client cases on the documented system (issue 25).

Builds a separate venv with accelerate 1.15 and the pinned clients (uv, always with
tools/constraints.txt), runs every case of integration_tests/clients/cases.py there, and stores each
case's figures (losses, final-parameter digests, checkpoints kept) as
integration_tests/clients/reference/CASE.json, which the ``clients`` nox session compares accel's runs
against (CI installs no second stack). With ``--compare PYTHON`` it also runs each case on accel with
that interpreter, right after the reference run, and prints steps/s of accel over the reference.

    python tools/record_client_reference.py [--venv DIR] [--cases NAME ...] [--compare .venv/bin/python] [--no-store]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "integration_tests" / "clients"))

import cases  # noqa: E402


def build_venv(venv: pathlib.Path) -> str:
    """The reference venv's python, building the venv first when it does not exist yet."""
    python = venv / "bin" / "python"
    if python.exists():
        return str(python)
    pins = [f"{name}=={version}" for name, version in cases.VERSIONS.items()]
    # peft too, as in the clients session: transformers imports it when present, which changes what a
    # run loads and collects (steps/s compared by tools/bench/clients.py)
    extras = ["datasets", "tensorboard", "torch", "peft==0.21.2"]
    subprocess.run(
        ["uv", "venv", "-q", str(venv), "--python", f"{sys.version_info[0]}.{sys.version_info[1]}"], check=True
    )
    subprocess.run(
        [
            "uv",
            "pip",
            "install",
            "--python",
            str(python),
            "-c",
            str(ROOT / "tools" / "constraints.txt"),
            *pins,
            *extras,
        ],
        check=True,
        env={**os.environ, "UV_FIND_LINKS": os.environ.get("UV_FIND_LINKS", "/opt/wheels")},
    )
    return str(python)


def installed_versions(python: str) -> dict[str, str]:
    code = "import importlib.metadata as m, json, sys; print(json.dumps({n: m.version(n) for n in sys.argv[1:]}))"
    done = subprocess.run([python, "-c", code, *cases.VERSIONS], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def _rate(figures: dict) -> float:
    rates = [f["steps_per_second"] for f in figures.values() if f.get("steps_per_second")]
    return sum(rates) / len(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--venv", type=pathlib.Path, default=pathlib.Path(tempfile.gettempdir()) / "accel-client-reference"
    )
    parser.add_argument("--cases", nargs="*", default=[case.name for case in cases.CASES])
    parser.add_argument("--compare", metavar="PYTHON", help="also run each case on accel with this interpreter")
    parser.add_argument("--no-store", action="store_true", help="do not write the reference files")
    options = parser.parse_args()
    reference_python = build_venv(options.venv)
    versions = installed_versions(reference_python)
    wanted = {name: version for name, version in cases.VERSIONS.items()}
    if versions != wanted:
        raise SystemExit(f"the reference venv {options.venv} holds {versions}, not {wanted}: remove it to rebuild")
    unknown = set(options.cases) - {case.name for case in cases.CASES}
    if unknown:
        raise SystemExit(f"unknown cases {sorted(unknown)}; known: {[case.name for case in cases.CASES]}")
    cases.REFERENCE.mkdir(exist_ok=True)
    for case in cases.CASES:
        if case.name not in options.cases:
            continue
        with tempfile.TemporaryDirectory() as work:
            figures = cases.run(case, reference_python, pathlib.Path(work) / "reference", on_accel=False)
            line = f"{case.name:14s} reference {_rate(figures):8.2f} steps/s"
            if options.compare:
                ours = cases.run(case, options.compare, pathlib.Path(work) / "accel", on_accel=True)
                line += f"  accel {_rate(ours):8.2f} steps/s  ratio {_rate(ours) / _rate(figures):5.2f}"
        print(line, flush=True)
        if not options.no_store:
            record = {"case": case.name, "versions": versions, "figures": figures}
            (cases.REFERENCE / f"{case.name}.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
