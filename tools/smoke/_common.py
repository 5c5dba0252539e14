"""Helpers shared by the clean-install smoke scripts (standard library only: nothing else is installed)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

TIMEOUT = 300


def check(condition: bool, message: str) -> None:
    """Fail the smoke run with ``message`` unless ``condition`` holds."""
    if not condition:
        raise SystemExit(f"SMOKE FAILED: {message}")


def run(*command: str, env: dict[str, str] | None = None) -> str:
    """Run ``command`` (output shown), fail the smoke run when it fails; return its stdout."""
    started = time.perf_counter()
    print("$", " ".join(command), flush=True)
    merged = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    done = subprocess.run(command, env=merged, capture_output=True, text=True, timeout=TIMEOUT, check=False)
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    check(done.returncode == 0, f"{' '.join(command)} exited with {done.returncode}")
    print(f"  ({time.perf_counter() - started:.1f} s)", flush=True)
    return done.stdout


def under_torchrun(script: str, nproc: int = 2) -> bool:
    """True inside a worker; otherwise start ``script`` on ``nproc`` processes with torch.distributed.run."""
    if "RANK" in os.environ:
        return True
    run(sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", script, "--worker")
    return False


def installed_distributions() -> list[str]:
    """Names of the distributions installed in this environment (shown so a reader sees nothing extra)."""
    from importlib import metadata

    return sorted({(d.metadata["Name"] or "").lower() for d in metadata.distributions()})
