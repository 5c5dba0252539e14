"""Every task of the repository, as nox sessions.

    nox -t ci                 everything CI runs (the README's test command)
    nox -s "tests(package='accel-state')"   one distribution, alone in a fresh venv
    nox -s demo               the main job: the README's first command
    nox -s bench              benchmarks against plain PyTorch and the reference release

Installs are pinned by ``tools/constraints.txt`` (torch==2.13.0, the CPU build of this project's
machines). ``ACCEL_CONSTRAINTS=/path/file`` uses another constraints file and
``ACCEL_CONSTRAINTS=""`` drops the pin. uv does not read pip's configuration, so pip's find-links
(``PIP_FIND_LINKS`` or ``pip config``) are handed to uv through ``UV_FIND_LINKS``.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import subprocess
import sys

import nox
import tomllib

# Let Python keep the bytecode of what it imports in each session's venv. A machine that sets
# PYTHONDONTWRITEBYTECODE (CI's does) makes every process the tests launch compile torch and the rest
# from source again: 2.7 s to import torch and accel_train instead of 1.3 s, hundreds of times a run.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

ROOT = pathlib.Path(__file__).resolve().parent
PACKAGES = ROOT / "packages"
REPORTS = ROOT / ".nox-reports"

nox.options.default_venv_backend = "uv|virtualenv"
nox.options.reuse_existing_virtualenvs = False
# Three sessions at a time (`nox -t ci`) on CI's 2 cores: one session's downloads, venv builds and waits on
# launched processes (a Ray cluster starting, a killed worker being noticed) overlap the others' tests; with
# two, 11% of the run's CPU time was idle (ci17: 178% of 200%). Every CI session below allows it;
# clean_reports runs first (the report writers require it) and summary last (it requires them all).
nox.options.parallel = 3
nox.options.sessions = ["deps", "lint", "tests", "trackers", "integration"]


def _read_distributions() -> dict[str, dict]:
    dists: dict[str, dict] = {}
    for pyproject in sorted(PACKAGES.glob("*/pyproject.toml")):
        meta = tomllib.loads(pyproject.read_text())["project"]
        in_repo = [
            req.split(">")[0].split("=")[0].split("<")[0].split("[")[0].strip() for req in meta.get("dependencies", [])
        ]
        dists[meta["name"]] = {
            "path": pyproject.parent,
            "requires": [r for r in in_repo if r.startswith("accel")],
            "dependencies": meta.get("dependencies", []),
        }
    return dists


DISTS = _read_distributions()
# Order: the dependency order of DESIGN.md, the meta-package last.
ORDER = [
    d
    for d in (
        "accel-state",
        "accel-data",
        "accel-bigmodel",
        "accel-quant",
        "accel-tracking",
        "accel-train",
        "accel-launch",
        "accel",
    )
    if d in DISTS
]


def _closure(name: str) -> list[str]:
    """``name`` and every in-repo distribution it needs, dependencies first."""
    seen: list[str] = []

    def visit(dist: str) -> None:
        for dep in DISTS[dist]["requires"]:
            visit(dep)
        if dist not in seen:
            seen.append(dist)

    visit(name)
    return seen


def _constraints() -> list[str]:
    value = os.environ.get("ACCEL_CONSTRAINTS")
    if value == "":
        return []
    path = pathlib.Path(value) if value else ROOT / "tools" / "constraints.txt"
    return ["-c", str(path)]


def _share_pip_find_links_with_uv() -> None:
    if "UV_FIND_LINKS" in os.environ:
        return
    links = os.environ.get("PIP_FIND_LINKS")
    if not links:
        try:
            links = subprocess.run(
                [sys.executable, "-m", "pip", "config", "get", "global.find-links"],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            links = ""
    if links:
        os.environ["UV_FIND_LINKS"] = ",".join(links.split())


_share_pip_find_links_with_uv()


def _install_deepspeed(session: nox.Session) -> None:
    """Install DeepSpeed with its CPU ops prebuilt (tools/deepspeed_cpu_wheel.py), before anything that
    asks for ``deepspeed`` so that the installer keeps this build.

    The wheel is built once per machine and torch pin under ``.nox/deepspeed-cpu-ops`` (about 2.5 minutes
    on 2 cores), by the first session that needs it; sessions running beside it wait for that build.
    Without it, each venv compiled the same ops on first use, minutes each, inside the first tests.
    """
    session.log("DeepSpeed with prebuilt CPU ops (tools/deepspeed_cpu_wheel.py; built once, then cached)")
    session.install(*_constraints(), _deepspeed_wheel(session))


def _deepspeed_wheel(session: nox.Session) -> str:
    """Path of the prebuilt-ops DeepSpeed wheel: from the cache, or built now (tools/deepspeed_cpu_wheel.py,
    which keeps the build's output in a log beside the wheel and prints its tail on failure)."""
    output = session.run(
        sys.executable,
        str(ROOT / "tools" / "deepspeed_cpu_wheel.py"),
        "--cache",
        str(ROOT / ".nox" / "deepspeed-cpu-ops"),
        *_constraints(),
        silent=True,
        external=True,
    )
    return str(output).strip().splitlines()[-1]


def _install_local(
    session: nox.Session, *dists: str, extras: dict[str, str] | None = None, deepspeed: bool = False
) -> None:
    """Install in-repo distributions from their folders (not from an index), with the torch pin;
    with ``deepspeed``, DeepSpeed's prebuilt-ops wheel first (``_install_deepspeed``).

    Also gives the C++ ops that DeepSpeed builds on first use (``TORCH_EXTENSIONS_DIR``) a folder of
    their own per venv path: their build line holds the venv's paths, so two venvs sharing
    ``~/.cache/torch_extensions`` rebuilt each other's ops on every alternate run, and could rebuild one
    under the other while it loads it. Outside the venv, so that a venv made anew at the same path (every
    nox run) finds its ops built.
    """
    location = getattr(session.virtualenv, "location", None)
    if isinstance(location, str):
        key = hashlib.sha256(os.path.abspath(location).encode()).hexdigest()[:16]
        folder = pathlib.Path.home() / ".cache" / "torch_extensions" / f"accel-nox-{key}"
        session.env["TORCH_EXTENSIONS_DIR"] = str(folder)
    extras = extras or {}
    if deepspeed:
        # the distributions without their extras first (torch and the rest: most of the install), while
        # another session may still be building the DeepSpeed wheel; then the wheel; then the extras
        session.install(*_constraints(), *[str(DISTS[dist]["path"]) for dist in dists])
        _add_extras(session, extras, deepspeed=True)
        return
    targets = []
    for dist in dists:
        path = str(DISTS[dist]["path"])
        targets.append(f"{path}[{extras[dist]}]" if dist in extras else path)
    session.install(*_constraints(), *targets)


def _add_extras(session: nox.Session, extras: dict[str, str], deepspeed: bool = False) -> None:
    """Add extras to in-repo distributions installed already (with ``deepspeed``, DeepSpeed's prebuilt-ops
    wheel first), naming only the distributions that get an extra: uv builds and reinstalls every local
    folder it is given, even one installed unchanged (about a CPU-second each)."""
    if deepspeed:
        _install_deepspeed(session)
    if extras:
        session.install(*_constraints(), *[f"{DISTS[dist]['path']}[{extra}]" for dist, extra in extras.items()])


#: The venvs whose bytecode `_warm_bytecode` has written in this nox run.
_WARMED: set[str] = set()


def _warm_bytecode(session: nox.Session) -> None:
    """Import the heavy modules once before the tests (tools/warm_bytecode.py): the first processes of a
    session start together, and each compiled the same bytecode (33 CPU-s lost per four processes)."""
    location = str(getattr(session.virtualenv, "location", ""))
    if location in _WARMED:
        return
    _WARMED.add(location)
    session.run("python", str(ROOT / "tools" / "warm_bytecode.py"), env={"ACCEL_PROVIDE_ACCELERATE": "1"}, silent=True)


def _pytest(session: nox.Session, report: str, *args: str, env: dict[str, str] | None = None) -> None:
    """pytest with a JUnit report and a CPU-time record per test (tools/cpu_per_test.py) in ``.nox-reports``,
    which the summary session adds up: CI is CPU-bound, so the CPU seconds say which tests are dear."""
    REPORTS.mkdir(exist_ok=True)
    _warm_bytecode(session)
    cpu_record = REPORTS / f"cpu-{report}.jsonl"
    cpu_record.unlink(missing_ok=True)
    tools_path = os.pathsep.join(filter(None, [str(ROOT / "tools"), (env or {}).get("PYTHONPATH")]))
    env = {**(env or {}), "CPU_PER_TEST_OUT": str(cpu_record), "PYTHONPATH": tools_path}
    session.run(
        "pytest",
        "-q",
        "-ra",
        "-p",
        "cpu_per_test",
        f"--junitxml={REPORTS / report}.xml",
        *args,
        *session.posargs,
        env=env,
    )


@nox.session(python=False, tags=["ci"])
def clean_reports(session: nox.Session) -> None:
    """Start a CI run with no test report of an earlier run."""
    for report in [*REPORTS.glob("*.xml"), *REPORTS.glob("cpu-*.jsonl")]:
        report.unlink()


@nox.session(tags=["ci"], allow_parallel=True, requires=["clean_reports"])
def integration(session: nox.Session) -> None:
    """End-to-end runs through the real ``accel launch``: multi-process, multi-machine, resume, offload.
    Defined first of the CI sessions: the longest, it starts first and the others run beside it."""
    _integration(session)


@nox.session(python=False, tags=["ci"], allow_parallel=True, requires=["clean_reports"])
def deepspeed_ops(session: nox.Session) -> None:
    """Build DeepSpeed with its CPU ops (tools/deepspeed_cpu_wheel.py) at the start of a CI run, beside
    the first sessions' installs; every session that installs DeepSpeed takes that wheel (and waits for it)."""
    session.log(f"DeepSpeed wheel with prebuilt CPU ops: {_deepspeed_wheel(session)}")


# Libraries that import the documented system by name, pinned; accel stands in for it through the
# opt-in alias (ACCEL_PROVIDE_ACCELERATE=1, accel.accelerate_alias).
CLIENT_PINS = {
    "transformers": "transformers==5.23.0",
    "peft": "peft==0.21.2",
    # issue 25: the figures in integration_tests/clients/reference were recorded with these releases
    "trl": "trl==1.16.0",
    "diffusers": "diffusers==0.42.1",
    "sentence-transformers": "sentence-transformers==6.2.0",
}


def _install_clients(session: nox.Session) -> None:
    """accel with DeepSpeed, and the client libraries pinned (CLIENT_PINS) beside it, without the real accelerate."""
    _install_local(session, *ORDER, extras={"accel": "test", "accel-train": "deepspeed"}, deepspeed=True)
    session.install(*_constraints(), CLIENT_PINS["transformers"])
    # peft, trl, diffusers' training and sentence-transformers' training require the real accelerate,
    # which accel stands in for: the clients without it, their other needs by hand
    clients = ("peft", "trl", "diffusers", "sentence-transformers")
    session.install(*_constraints(), "--no-deps", *[CLIENT_PINS[name] for name in clients])
    session.install(*_constraints(), "psutil", "tqdm", "packaging", "pyyaml", "huggingface_hub", "pytest-xdist")
    session.install(
        *_constraints(), "datasets", "tensorboard", "jinja2", "pandas", "pyarrow", "Pillow", "importlib_metadata",
        "scikit-learn", "scipy", "requests", "regex", "filelock", "typing_extensions",
    )  # fmt: skip
    session.run("python", "-c", "import importlib.util as u, sys; sys.exit(u.find_spec('accelerate') is not None)")


def _clients(session: nox.Session) -> None:
    _install_clients(session)
    # each case mostly waits on the client stack it starts: two workers, any case to either. A run that
    # several cases read is made once under a file lock by the first worker that needs it (pytest 9 with
    # pytest-xdist 3.8 ignores xdist_group: the group suffix goes to item._nodeid, which pytest 9 no longer reads)
    _pytest(session, "clients", "-n", "2", "--dist", "loadgroup", str(ROOT / "integration_tests" / "clients"))
    # accel-train's tests that need transformers beside DeepSpeed / tensor parallelism (skipped in its
    # own session, which has no transformers)
    train_tests = DISTS["accel-train"]["path"] / "tests"
    session.install(*_constraints(), "bitsandbytes")  # FSDP-QLoRA: 4-bit layers beside peft
    _pytest(
        session,
        "clients-train",
        str(train_tests / "test_train_deepspeed_transformers.py"),
        str(train_tests / "test_train_tp_transformers_plans.py"),
        str(train_tests / "test_train_fsdp_qlora.py"),
    )


@nox.session(tags=["ci"], allow_parallel=True, requires=["clean_reports"])
def clients(session: nox.Session) -> None:
    """transformers' Trainer (1 and 2 processes, resume, evaluation loss), from_pretrained with part of
    the model on disk, a peft LoRA adapter, and TRL (SFT, DPO), a diffusers training loop (on 2 processes
    saving from the main process only, as its examples do) and sentence-transformers, 1 and 2 processes,
    compared with the figures of the same runs on the documented system
    (integration_tests/clients/reference, tools/record_client_reference.py), on accel through the
    ``accelerate`` alias."""
    _clients(session)


@nox.session(tags=["ci"], allow_parallel=True, requires=["clean_reports"])
def docs(session: nox.Session) -> None:
    """The documentation site (as ``docs_site``), then every code block of the guide run.

    ``nox -s docs -- --no-run`` builds the site only. Other arguments are pages for
    ``tools/run_doc_examples.py`` to run alone. On a machine without chromium where apt-get works as
    root (CI), chromium is installed first so that the browser check runs for real. In CI it starts
    third (after ``integration`` and the DeepSpeed build), in a venv of its own.
    """
    _docs(session, list(session.posargs))


# CI starts the distributions' sessions longest first (measured on 2 cores: accel-train 7 minutes, accel-state
# 3, accel 2, the others about one), so that the run does not end on one long session beside an idle lane.
_LONGEST_TESTS = ("accel-train", "accel-state", "accel", "accel-launch")
_TESTS_LONGEST_FIRST = [d for d in _LONGEST_TESTS if d in ORDER] + [d for d in ORDER if d not in _LONGEST_TESTS]


@nox.session(tags=["ci"], allow_parallel=True, requires=["clean_reports"])
@nox.parametrize("package", _TESTS_LONGEST_FIRST)
def tests(session: nox.Session, package: str) -> None:
    """One distribution alone: a fresh venv with it and its in-repo dependencies, where its smoke script
    runs first (what ``clean_install`` checks: only the declared dependencies installed); then its test
    extra and its tests. One venv and one install of the distributions for both checks."""
    needed = _closure(package)
    _install_local(session, *needed)
    _smoke(session, package)
    # accel-train's test extra asks for DeepSpeed
    _add_extras(session, {package: "test"}, deepspeed=package == "accel-train")
    # accel-train's suite is mostly waiting on spawned gloo processes: two workers (a test file each,
    # so that a file's tests share their worker's process pools) keep both cores busy
    parallel = ["-n", "2", "--dist", "loadfile"] if package == "accel-train" else []
    _pytest(session, f"tests-{package}", *parallel, str(DISTS[package]["path"] / "tests"))


@nox.session(tags=["ci"], allow_parallel=True, requires=["clean_reports"])
def typecheck(session: nox.Session) -> None:
    """mypy over every distribution's source."""
    _install_local(session, *ORDER)
    session.install("mypy")
    session.run("mypy", *[str(DISTS[d]["path"] / "src") for d in ORDER])


# Ray and the trackers come after the distributions' tests and before the shortest sessions: their minutes
# are mostly waits (Ray starting its cluster, the trackers' downloads), which the sessions beside them fill.
@nox.session(tags=["ci"], allow_parallel=True, requires=["clean_reports"])
def ray(session: nox.Session) -> None:
    """An accel script under Ray Train's TorchTrainer (2 CPU workers, loopback only), as under accel launch."""
    _install_local(session, *ORDER, extras={"accel": "test", "accel-launch": "ray"})
    session.install(*_constraints(), "safetensors")
    _pytest(session, "ray", str(ROOT / "integration_tests" / "test_cluster_ray.py"))


TRACKER_EXTRAS = "tensorboard,wandb,comet_ml,aim,mlflow,clearml,dvclive,trackio,swanlab,test"


@nox.session(tags=["ci"], allow_parallel=True, requires=["clean_reports"])
def trackers(session: nox.Session) -> None:
    """accel-tracking with every tracking backend installed, each tested against its real library."""
    _install_local(session, *_closure("accel-tracking"), extras={"accel-tracking": TRACKER_EXTRAS})
    _pytest(session, "trackers", str(DISTS["accel-tracking"]["path"] / "tests"), "-m", "trackers")


@nox.session(tags=["ci"], allow_parallel=True, requires=["clean_reports"])
def deps(session: nox.Session) -> None:
    """The dependency graph of DESIGN.md holds (imports, ranges, meta pins, CI command); the tools work."""
    # the docs tools' tests read YAML options and walk code with griffe, as the site build does
    session.install("packaging", "pytest", "pyyaml", "griffelib")
    session.run("python", str(ROOT / "tools" / "check_deps.py"))
    _pytest(session, "tools", str(ROOT / "tools" / "tests"))


@nox.session(tags=["ci"], allow_parallel=True, requires=["clean_reports"])
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check over the whole repository."""
    session.install("ruff")
    session.run("ruff", "check", str(ROOT))
    session.run("ruff", "format", "--check", str(ROOT))


@nox.session
def slow(session: nox.Session) -> None:
    """Before a release, what CI leaves out for time: the crash-safety tests killed at every file-system
    step of a save, not only at the commit steps and a spread of the rest (``ACCEL_KILL_POINTS=all``),
    and the end-to-end cases marked ``release``, which repeat a case CI runs on another process count
    or variant (``ACCEL_RELEASE_TESTS=1``; each marker names the case that covers it in CI), and the
    N -> M resharding of every backend in the table (CI runs the backends that shard differently)."""
    _install_clients(session)
    session.install(
        *_constraints(), f"{DISTS['accel-bigmodel']['path']}[test]", f"{DISTS['accel-train']['path']}[test]"
    )
    session.install(*_constraints(), "numpy", "safetensors", "tqdm", "psutil", "pytest-xdist")
    tests = [
        DISTS["accel-bigmodel"]["path"] / "tests" / "test_bigmodel_checkpoint_safety.py",
        DISTS["accel-train"]["path"] / "tests" / "test_checkpoint_kill.py",
        DISTS["accel-train"]["path"] / "tests" / "test_contract_resume.py",  # every backend's N -> M resharding
    ]
    _pytest(
        session, "slow", *[str(path) for path in tests], env={"ACCEL_KILL_POINTS": "all", "ACCEL_RELEASE_TESTS": "1"}
    )
    release = ["-m", "release", "-n", "2", "--dist", "load", str(ROOT / "integration_tests")]
    _pytest(session, "slow-release", *release, env={"ACCEL_RELEASE_TESTS": "1"})


#: torch_xla publishes builds for one torch release each; this pair installs from the package index (about
#: 7 GB: that torch build brings CUDA libraries). Not in tools/constraints.txt, whose torch pin it replaces.
XLA_PINS = ("torch==2.9.0", "torch_xla==2.9.0")


@nox.session(reuse_venv=True)
def xla(session: nox.Session) -> None:
    """Before a release: XLA for real, on torch_xla's CPU device (``PJRT_DEVICE=CPU``), with torch 2.9.0 +
    torch_xla 2.9.0 instead of the constraints' torch. The issue-39 script trains on ``xla:0`` with the
    losses of ``cpu=True``; save/load, a planted pickle, RNG, loader position, collectives, bf16; the
    state's choice of XLA (``USE_TORCH_XLA=0``, ``cpu=True``); ``accel launch --tpu`` (and a config with
    ``distributed_type: XLA``) on one host, one replica. Not in ``-t ci``: the first install takes
    about 7 GB and minutes; its venv is kept between runs (then only checked). Tests that skip without
    torch_xla in CI run here for real."""
    session.install(*XLA_PINS)
    # accel's distributions without resolving their torch again (the pair above is the one to test)
    session.install("--no-deps", *[str(DISTS[dist]["path"]) for dist in ORDER])
    session.install(*XLA_PINS, "numpy", "safetensors", "pyyaml", "packaging", "psutil", "tqdm", "pytest")
    env = {"PJRT_DEVICE": "CPU"}
    state_tests, train_tests = DISTS["accel-state"]["path"] / "tests", DISTS["accel-train"]["path"] / "tests"
    # one pytest per file: each tests folder has its own conftest.py, the selection tests need a process
    # where torch_xla was never imported, and the device tests one where it was imported before any backward
    _pytest(session, "xla-state", str(state_tests / "test_state_xla_selection.py"), env=env)
    _pytest(session, "xla-fake", str(train_tests / "test_train_xla.py"), env=env)
    _pytest(session, "xla", str(train_tests / "test_xla_device.py"), env=env)


#: What the torch_floor session runs of each distribution on the oldest torch declared: whole folders where
#: they are small; accel-quant without the two FP8 tests that need torchao (neither torchao nor bitsandbytes
#: is installed there); accel-train one device, DDP on 2 gloo processes, FSDP1/FSDP2, the ND mesh with expert
#: parallelism, checkpoints, pipelining, DeepSpeed; accel-launch ``accel launch`` of multi-process scripts.
#: A distribution runs only when the release installed is its own declared floor (or it declares no torch).
TORCH_FLOOR_TESTS = {
    "accel-state": ["."],
    "accel-data": ["."],
    "accel-bigmodel": ["."],
    "accel-quant": ["."],
    "accel-tracking": ["test_tracking_core.py"],
    "accel-train": [
        "test_train_accelerator.py", "test_train_distributed.py", "test_train_fsdp_distributed.py",
        "test_train_fsdp_one_process.py", "test_train_checkpoint.py", "test_train_nd_parallel.py",
        "test_train_expert_parallel.py", "test_train_pipeline.py", "test_mesh.py",
        "test_train_deepspeed_distributed.py",
    ],
    "accel-launch": ["test_launch_cli.py", "test_launch_launchers.py"],
}  # fmt: skip
#: Left out of TORCH_FLOOR_TESTS, by test id inside the distribution's tests folder.
TORCH_FLOOR_DESELECT = {
    # need torchao, which the session does not install
    "accel-quant": [
        "test_fp8_choice_and_recipes.py::test_explicit_backend_wins_over_environment",
        "test_fp8_choice_and_recipes.py::test_environment_wins_over_installed",
    ],
    # torch 2.9's FSDP2 cannot reduce unused parameters: resuming listed experts with plain dp_shard=2 is
    # refused there by name (test_listed_experts_over_dp_shard_are_refused_by_name_... covers it); passes on 2.13
    "accel-train": ["test_train_expert_parallel.py::test_a_checkpoint_of_listed_experts_resumes_and_reshards"],
}


def _declared_torch_floor(dist: str) -> tuple[int, ...] | None:
    """The release named by ``dist``'s ``torch>=X`` requirement (None: it does not require torch)."""
    for requirement in DISTS[dist]["dependencies"]:
        name, _, version = requirement.replace(" ", "").partition(">=")
        if name == "torch" and version:
            return tuple(int(part) for part in version.split(",")[0].split("."))
    return None


@nox.session(reuse_venv=True)
def torch_floor(session: nox.Session) -> None:
    """Before a release: the oldest torch the distributions declare (the lowest ``torch>=`` of their
    pyproject.toml files, 2.9 today) in place of the constraints' torch, and ``TORCH_FLOOR_TESTS`` of each
    distribution whose floor that is (or that needs no torch of its own: accel-tracking): one device, DDP,
    FSDP, ND/expert parallel, checkpoints, pipelining, DeepSpeed where accel-train runs (a CPU-ops wheel built
    for that torch by tools/deepspeed_cpu_wheel.py and cached), big-model loading, ``accel launch``. Not in
    ``-t ci``: torch 2.9.0 from the index is the CUDA build (about 7 GB with its libraries, the download of
    ``xla``'s ``XLA_PINS``); the venv is kept between runs. ``nox -s torch_floor -- -x`` passes pytest
    options on."""
    floors = {dist: _declared_torch_floor(dist) for dist in TORCH_FLOOR_TESTS}
    oldest = min(floor for floor in floors.values() if floor is not None)
    version = ".".join(str(part) for part in oldest)
    torch_pin = f"torch=={version}" if len(oldest) == 3 else f"torch=={version}.*"
    selected = [dist for dist, floor in floors.items() if floor in (None, oldest)]
    session.log(f"torch {version}: {', '.join(selected)}; on a newer floor: {sorted(set(floors) - set(selected))}")
    # setuptools: torch 2.9's compiler (pipelining traces through it) imports it, and uv's venvs lack it
    session.install(torch_pin, "setuptools")
    # accel's distributions without resolving their torch again (the release above is the one to test)
    session.install("--no-deps", *[str(DISTS[dist]["path"]) for dist in ORDER])
    pins = pathlib.Path(session.create_tmp()) / "torch-floor-constraints.txt"
    pins.write_text(torch_pin + "\n")
    if "accel-train" in selected:
        wheel = session.run(
            sys.executable, str(ROOT / "tools" / "deepspeed_cpu_wheel.py"), "--cache",
            str(ROOT / ".nox" / "deepspeed-cpu-ops"), "-c", str(pins), silent=True, external=True,
        )  # fmt: skip
        session.install("-c", str(pins), str(wheel).strip().splitlines()[-1])
    common = ("numpy", "safetensors", "pyyaml", "packaging", "psutil", "tqdm", "transformers")
    session.install("-c", str(pins), *common, "pytest", "pytest-timeout", "pytest-xdist")
    session.run("python", "-c", f"import torch; assert torch.__version__.startswith('{version}'), torch.__version__")
    # one pytest per distribution: each tests folder has its own conftest.py
    for dist in selected:
        tests = DISTS[dist]["path"] / "tests"
        args = [str(tests / item) for item in TORCH_FLOOR_TESTS[dist]]
        for test_id in TORCH_FLOOR_DESELECT.get(dist, []):  # node ids are relative to the repository root
            args += ["--deselect", f"{tests.relative_to(ROOT).as_posix()}/{test_id}"]
        _pytest(session, f"torch-floor-{dist}", *args, env={"OMP_NUM_THREADS": "1"})


def _smoke(session: nox.Session, package: str) -> None:
    """The distribution's smoke script (tools/smoke), run from an empty folder."""
    script = ROOT / "tools" / "smoke" / f"smoke_{package.replace('-', '_')}.py"
    with session.chdir(session.create_tmp()):
        session.run("python", str(script), env={"OMP_NUM_THREADS": "1"})


@nox.session
@nox.parametrize("package", ORDER)
def clean_install(session: nox.Session, package: str) -> None:
    """One distribution installed alone with only its declared dependencies (no test extra, no
    numpy/tqdm/psutil added by hand), then its smoke script in tools/smoke, run from an empty folder.
    CI runs the same check inside ``tests``, before the test extra is installed."""
    _install_local(session, *_closure(package))
    _smoke(session, package)


def _integration(session: nox.Session) -> None:
    _install_local(session, *ORDER, extras={"accel": "test", "accel-train": "deepspeed"}, deepspeed=True)
    session.install(*_constraints(), "numpy", "safetensors", "tqdm", "psutil", "pytest-xdist")
    # each test mostly waits on the processes it launches: two workers (a test file each) keep both cores busy
    _pytest(session, "integration", "-n", "2", "--dist", "loadfile", str(ROOT / "integration_tests"))


#: The site generator and what its build needs (MkDocs + Material + mkdocstrings; matplotlib for the
#: benchmark plots), pinned so that a build today renders as the one that was checked.
DOCS_SITE_PINS = (
    "mkdocs==1.6.1",
    "mkdocs-material==9.8.1",
    "mkdocstrings==1.0.8",
    "mkdocstrings-python==2.0.11",
    "mkdocs-autorefs==1.4.5",
    "pymdown-extensions==13.1",
    "matplotlib",
)


def _docs_site(session: nox.Session, installed: bool = False) -> None:
    """Install accel (unless ``installed``: the session has it already) and the site generator; check
    docstrings (ratchet); build the site strictly and check it (anchors, descriptions, search index); open
    it in headless chromium when there is one."""
    if not installed:
        _install_local(session, *ORDER)
    session.install(*_constraints(), *DOCS_SITE_PINS)
    session.run("python", str(ROOT / "tools" / "check_docstrings.py"), silent=True)
    session.run("python", str(ROOT / "tools" / "build_guide.py"))
    session.run("python", str(ROOT / "tools" / "check_browser.py"))


@nox.session(reuse_venv=True)
def docs_site(session: nox.Session) -> None:
    """The documentation site only (no example runs): build/site/index.html, strict, checked. Fast;
    its venv is kept between runs (the installs then only check what is there)."""
    _docs_site(session)


def _docs(session: nox.Session, posargs: list[str], installed: bool = False) -> None:
    no_run = "--no-run" in posargs
    pages = [arg for arg in posargs if arg != "--no-run"]
    if not shutil.which("chromium") and shutil.which("apt-get") and os.geteuid() == 0:
        session.run(
            "bash",
            "-c",
            "(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null",
            external=True,
        )
    _docs_site(session, installed)
    if no_run:
        return
    _install_deepspeed(session)
    session.install(*_constraints(), "numpy", "safetensors", "tqdm", "tensorboard", "bitsandbytes", "deepspeed")
    session.run("python", str(ROOT / "tools" / "run_doc_examples.py"), "--quiet", "--jobs", "2", *pages)


_CI_SESSIONS = [
    "integration",
    "deepspeed_ops",
    "clients",
    "docs",
    "ray",
    "trackers",
    "deps",
    "lint",
    *[f"tests(package='{package}')" for package in _TESTS_LONGEST_FIRST],
    "typecheck",
]


@nox.session(python=False, tags=["ci"], requires=_CI_SESSIONS)
def summary(session: nox.Session) -> None:
    """One closing line adding up every pytest report of this run (the last CI session)."""
    session.run(sys.executable, str(ROOT / "tools" / "test_summary.py"), str(REPORTS))


@nox.session
def demo(session: nox.Session) -> None:
    """The main job (README's first command)."""
    _install_local(session, *ORDER)
    session.install(*_constraints(), "numpy", "tqdm")
    demo_script = ROOT / "examples" / "collectives_demo.py"
    train_script = ROOT / "examples" / "train_demo.py"
    if train_script.exists():
        session.run("accel", "launch", "--cpu", "--num_processes", "2", str(train_script), *session.posargs)
    else:
        session.run("python", "-m", "torch.distributed.run", "--nproc_per_node", "2", str(demo_script))


REFERENCE_VENV = ROOT / ".venv-reference"


@nox.session
def bench(session: nox.Session) -> None:
    """Every benchmark in tools/bench, beside plain PyTorch and the reference ``accelerate`` release, with
    what they measure installed: DeepSpeed (its prebuilt-ops wheel, in both venvs), bitsandbytes, Ray. The
    client libraries' benchmark (tools/bench/clients.py) runs from the clients' venvs and says so here; the
    GPU one says it found no GPU. ``nox -s bench -- tools/bench/cli.py`` runs the ones named."""
    extras = {"accel-quant": "bnb", "accel-train": "deepspeed", "accel-launch": "ray"}
    _install_local(session, *ORDER, extras=extras, deepspeed=True)
    session.install(*_constraints(), "numpy", "safetensors", "psutil", "tqdm")
    if not (REFERENCE_VENV / "bin" / "python").exists():
        session.run("uv", "venv", "-q", str(REFERENCE_VENV), external=True)
    reference = ("accelerate==1.15.0", "numpy", "safetensors", "psutil", _deepspeed_wheel(session))
    session.run(
        "uv", "pip", "install", "-q", "--python", str(REFERENCE_VENV / "bin" / "python"), *_constraints(), *reference,
        external=True,
    )  # fmt: skip
    # every ratio is also appended to .bench-results.jsonl, which the docs site plots
    env = {
        "ACCEL_REFERENCE_PYTHON": str(REFERENCE_VENV / "bin" / "python"),
        "ACCEL_BENCH_RESULTS": str(ROOT / ".bench-results.jsonl"),
    }
    scripts = session.posargs or sorted(
        str(p) for p in (ROOT / "tools" / "bench").glob("*.py") if not p.name.startswith("_")
    )
    for script in scripts:
        session.run("python", script, env=env)
