"""Build DeepSpeed once per machine and torch pin, with the CPU ops the tests use compiled in.

DeepSpeed ships as a source distribution only; installed plainly, it compiles its C++ ops the first
time a process needs them (torch's JIT extension loader), into a folder whose build line holds the
venv's own paths. Every nox session that uses DeepSpeed has a venv of its own, so a CI run compiled
the same two ops (``cpu_adam``, ~2 min of one core, and ``deepspeed_shm_comm``, which every DeepSpeed
start on CPU loads) once per venv, and the tests that came first waited minutes for them.

This script builds a DeepSpeed wheel that carries those ops prebuilt (DeepSpeed's own
``DS_BUILD_<OP>=1`` ahead-of-time build, the two ops compiled side by side) and prints its path. DeepSpeed
loads a prebuilt op instead of compiling it when the wheel says the op was installed for the same
accelerator and torch release, so a venv that installs the wheel compiles nothing.

The wheel is kept under ``--cache``, in a folder named after what the build depends on (Python, the
constraints file's text, the DeepSpeed version asked for); a second caller, in this run or a later one,
gets the same file. A lock file makes concurrent callers (nox sessions running side by side) wait for the
one build instead of starting their own.

Usage: ``python tools/deepspeed_cpu_wheel.py --cache .nox/deepspeed-cpu-ops [-c constraints.txt]``.
The last line printed is the wheel's path. Build output goes to ``build.log`` beside the wheel; its last
lines are printed when the build fails.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile

# The ops the test suites load on CPU: DeepSpeedCPUAdam (optimizer offload) and the shared-memory
# collectives DeepSpeed's CPU accelerator loads at every start. Their DS_BUILD_* names.
PREBUILT_OPS = ("CPU_ADAM", "SHM_COMM")
BUILD_TOOLS = ("setuptools", "wheel")


def cache_key(constraints_text: str, requirement: str) -> str:
    """Name of the cache folder for a build: what the wheel's compiled code depends on."""
    parts = [sys.version.split()[0], platform.machine(), platform.platform(terse=True), constraints_text, requirement]
    parts.append("-g0")  # the compile flags (build_environment): a wheel built with others is not reused
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def build_environment(base: dict[str, str], jobs: int) -> dict[str, str]:
    """The environment of DeepSpeed's setup.py: no op prebuilt but ``PREBUILT_OPS``, CPU accelerator,
    no debug information in the compiled code."""
    env = dict(base)
    env["DS_BUILD_OPS"] = "0"
    for op in PREBUILT_OPS:
        env[f"DS_BUILD_{op}"] = "1"
    env["DS_ACCELERATOR"] = "cpu"
    env["MAX_JOBS"] = str(jobs)
    # Python's own compile flags ask for debug info (-g); nobody debugs these ops from the wheel, and
    # leaving it out (-g0, after -g on the line) makes each file compile in three quarters of the time
    env["CFLAGS"] = " ".join(filter(None, (base.get("CFLAGS", ""), "-g0")))
    return env


def _run(command: list[str], log: pathlib.Path, env: dict[str, str] | None = None, cwd: str | None = None) -> None:
    with log.open("a") as out:
        out.write(f"$ {' '.join(command)}\n")
        out.flush()
        result = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd, check=False)
    if result.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-40:]
        sys.stderr.write("\n".join(tail) + "\n")
        raise SystemExit(
            f"deepspeed_cpu_wheel: `{' '.join(command[:4])} ...` failed with exit code {result.returncode}; "
            f"the whole output is in {log}"
        )


def build(folder: pathlib.Path, constraints: list[str], requirement: str, jobs: int) -> pathlib.Path:
    """Build the wheel into ``folder/dist`` and return its path (see the module docstring)."""
    uv = shutil.which("uv")
    if uv is None:
        raise SystemExit("deepspeed_cpu_wheel: needs `uv` on PATH (python3 -m pip install uv)")
    log = folder / "build.log"
    log.write_text("")
    venv = folder / "build-venv"
    shutil.rmtree(venv, ignore_errors=True)
    _run([uv, "venv", "--quiet", "--python", sys.executable, str(venv)], log)
    python = str(venv / "bin" / "python")
    with tempfile.TemporaryDirectory(dir=folder) as scratch:
        _run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
             *constraints, requirement, "-d", scratch],
            log,
        )  # fmt: skip
        archives = sorted(pathlib.Path(scratch).glob("deepspeed-*.tar.gz"))
        if len(archives) != 1:
            raise SystemExit(f"deepspeed_cpu_wheel: expected one DeepSpeed source archive in {scratch}, got {archives}")
        with tarfile.open(archives[0]) as archive:
            archive.extractall(scratch, filter="data")
        source = next(path for path in pathlib.Path(scratch).iterdir() if path.is_dir())
        requirements = source / "requirements" / "requirements.txt"
        _run(
            [uv, "pip", "install", "--quiet", "--python", python, *constraints, *BUILD_TOOLS, "-r", str(requirements)],
            log,
        )
        dist = folder / "dist"
        shutil.rmtree(dist, ignore_errors=True)
        env = build_environment(os.environ, jobs)
        command = [python, "setup.py", "build_ext", "--parallel", str(jobs), "bdist_wheel", "--dist-dir", str(dist)]
        _run(command, log, env=env, cwd=str(source))
    wheels = sorted(dist.glob("deepspeed-*.whl"))
    if len(wheels) != 1:
        raise SystemExit(f"deepspeed_cpu_wheel: the build left {len(wheels)} wheels in {dist}; see {log}")
    shutil.rmtree(venv, ignore_errors=True)
    return wheels[0]


def cached_or_built(cache: pathlib.Path, constraints_file: str | None, requirement: str, jobs: int) -> pathlib.Path:
    """The wheel for these inputs: from the cache, or built now while holding the cache's lock."""
    constraints_text = pathlib.Path(constraints_file).read_text() if constraints_file else ""
    folder = cache / cache_key(constraints_text, requirement)
    folder.mkdir(parents=True, exist_ok=True)
    with (cache / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        wheels = sorted((folder / "dist").glob("deepspeed-*.whl"))
        if len(wheels) == 1:
            return wheels[0]
        constraints = ["-c", constraints_file] if constraints_file else []
        return build(folder, constraints, requirement, jobs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", required=True, type=pathlib.Path, help="folder that keeps built wheels")
    parser.add_argument("-c", "--constraints", default=None, help="pip constraints file (the torch pin)")
    parser.add_argument("--requirement", default="deepspeed", help="which DeepSpeed to build (default: newest)")
    parser.add_argument("--jobs", type=int, default=max(1, min(len(PREBUILT_OPS), os.cpu_count() or 1)))
    args = parser.parse_args(argv)
    wheel = cached_or_built(args.cache.resolve(), args.constraints, args.requirement, args.jobs)
    print(wheel)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
