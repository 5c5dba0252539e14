"""Run every code block of the user guide, so that a page cannot drift from the code.

    python tools/run_doc_examples.py                 # every docs/*.md page
    python tools/run_doc_examples.py docs/launching.md --list
    python tools/run_doc_examples.py --jobs 2 --quiet         # two pages at a time (CI)

Each page gets a scratch folder; its blocks run there, in page order, so a later block can use a
file an earlier one wrote. What a block does is set by its fence's info string:

``` python                      run with this interpreter
``` bash                        run with ``bash -euo pipefail`` (this interpreter's ``bin`` first
                                on ``PATH``, so ``accel`` is the real command of this environment)
``` python processes=2          run through the real ``accel launch --cpu --num_processes 2``
``` yaml file=config.yaml       not run: written to the scratch folder under that name (any language)
``` python run-if=MOD[,MOD]     run only when every condition holds, else skipped with the reason:
                                ``pkg.module`` importable, ``pkg.module:name`` has that name,
                                ``cuda`` a CUDA device is present
``` python timeout=600          a longer limit than the default 300 s

Blocks in any other language (``text``, ``console``, ``yaml`` without ``file=``) are shown, not run.
Every block runs with ``HF_HOME`` inside the scratch folder (no user config is read or written)
and ``OMP_NUM_THREADS=1``. The exit status is 1 when a block fails or when no block ran at all.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import importlib
import os
import pathlib
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable

ROOT = pathlib.Path(__file__).resolve().parents[1]
RUNNABLE = ("python", "bash")
DEFAULT_TIMEOUT = 300.0
FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>.*)$")


@dataclasses.dataclass
class Block:
    """One fenced code block of a page: where it is, its language, its attributes and its text."""

    path: pathlib.Path
    line: int
    language: str
    attributes: dict[str, str]
    code: str

    @property
    def where(self) -> str:
        """``docs/page.md:LINE``, relative to the repository when it is inside it."""
        try:
            shown = self.path.resolve().relative_to(ROOT)
        except ValueError:
            shown = self.path
        return f"{shown}:{self.line}"

    @property
    def runnable(self) -> bool:
        """True for python and bash blocks that are not only written to a file."""
        return self.language in RUNNABLE and "file" not in self.attributes


def parse_info(info: str) -> tuple[str, dict[str, str]]:
    """Language and ``key=value`` attributes of a fence's info string (a bare word maps to "")."""
    words = shlex.split(info.strip())
    if not words:
        return "", {}
    language, attributes = words[0].lower(), {}
    for word in words[1:]:
        key, _, value = word.partition("=")
        attributes[key] = value
    unknown = set(attributes) - {"file", "processes", "run-if", "timeout"}
    if unknown:
        raise ValueError(
            f"unknown code-block attribute(s) {sorted(unknown)} in {info!r}; known: file, processes, run-if, timeout"
        )
    return language, attributes


def extract_blocks(path: pathlib.Path) -> list[Block]:
    """Every fenced block of a Markdown file, in order, with the line its fence opens on."""
    blocks: list[Block] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    index = 0
    while index < len(lines):
        match = FENCE.match(lines[index])
        if not match or "`" in match.group("info"):
            index += 1
            continue
        fence, indent = match.group("fence"), len(match.group("indent"))
        try:
            language, attributes = parse_info(match.group("info"))
        except ValueError as error:
            raise ValueError(f"{path}:{index + 1}: {error}") from None
        body: list[str] = []
        end = index + 1
        while end < len(lines) and not re.match(rf"^ {{0,3}}{fence[0]}{{{len(fence)},}}\s*$", lines[end]):
            body.append(lines[end][indent:] if lines[end][:indent].isspace() else lines[end])
            end += 1
        if end == len(lines):
            raise ValueError(f"{path}:{index + 1}: code block never closed")
        blocks.append(Block(path, index + 1, language, attributes, "\n".join(body) + "\n"))
        index = end + 1
    return blocks


def unmet_condition(conditions: str) -> str | None:
    """The reason a ``run-if`` list does not hold, or None when every condition holds."""
    for condition in filter(None, (c.strip() for c in conditions.split(","))):
        if condition == "cuda":
            import torch

            if not torch.cuda.is_available():
                return "no CUDA device"
            continue
        module_name, _, attribute = condition.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            return f"{module_name} is not importable ({error})"
        if attribute and not hasattr(module, attribute):
            return f"{module_name} has no {attribute}"
    return None


def accel_command() -> list[str]:
    """The real ``accel`` console script of this environment (or its module form)."""
    script = pathlib.Path(sys.executable).parent / "accel"
    return [str(script)] if script.exists() else [sys.executable, "-m", "accel_launch.cli"]


def block_environment(workdir: pathlib.Path) -> dict[str, str]:
    """The environment every block runs in: this interpreter first on PATH, a private HF_HOME."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(pathlib.Path(sys.executable).parent), env.get("PATH", "")])
    env["HF_HOME"] = str(workdir / "hf_home")
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(workdir), env.get("PYTHONPATH", "")]))
    for name in [n for n in env if n.startswith(("ACCELERATE_", "FSDP_")) or n in ("RANK", "WORLD_SIZE", "LOCAL_RANK")]:
        del env[name]  # a block sees the environment a user's shell has, not the one of a launched run
    return env


def command_for(block: Block, script: pathlib.Path) -> list[str]:
    """How one runnable block is started, its code already written to ``script``."""
    if block.language == "bash":
        return ["bash", "-euo", "pipefail", str(script)]
    processes = block.attributes.get("processes")
    if processes:
        if not processes.isdigit() or int(processes) < 1:
            raise ValueError(f"{block.where}: processes={processes!r} must be a positive integer")
        return [*accel_command(), "launch", "--cpu", "--num_processes", processes, str(script)]
    return [sys.executable, str(script)]


@dataclasses.dataclass
class Outcome:
    """What happened to one block: ``ran``, ``skipped``, ``failed`` or ``written``, with details."""

    block: Block
    status: str
    seconds: float = 0.0
    detail: str = ""


def run_block(block: Block, workdir: pathlib.Path) -> Outcome:
    """Write, skip or run one block in ``workdir``."""
    if "file" in block.attributes:
        target = workdir / block.attributes["file"]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(block.code, encoding="utf-8")
        return Outcome(block, "written", detail=block.attributes["file"])
    reason = unmet_condition(block.attributes.get("run-if", ""))
    if reason is not None:
        return Outcome(block, "skipped", detail=reason)
    suffix = ".py" if block.language == "python" else ".sh"
    script = workdir / f"_block_{block.line}{suffix}"
    script.write_text(block.code, encoding="utf-8")
    timeout = float(block.attributes.get("timeout") or DEFAULT_TIMEOUT)
    start = time.perf_counter()
    # Its own process group: on a timeout every process it started (launched ranks too) is killed.
    process = subprocess.Popen(
        command_for(block, script),
        cwd=workdir,
        env=block_environment(workdir),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        return Outcome(block, "failed", time.perf_counter() - start, f"timed out after {timeout:.0f} s\n{output}")
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # nothing it started outlives it
        except ProcessLookupError:
            pass
    seconds = time.perf_counter() - start
    if process.returncode != 0:
        return Outcome(block, "failed", seconds, f"exit status {process.returncode}\n{output}")
    return Outcome(block, "ran", seconds, output)


def default_pages(root: pathlib.Path = ROOT) -> list[pathlib.Path]:
    """The pages run when none are named: every ``docs/*.md`` of the guide, in name order (the site's
    note that a page's examples run in CI is written for these pages, by the same rule)."""
    return sorted((root / "docs").glob("*.md"))


def run_page(path: pathlib.Path, keep: bool = False) -> list[Outcome]:
    """Every block of one page, in order, in one scratch folder (removed afterwards unless ``keep``)."""
    blocks = extract_blocks(path)
    if not any(b.language in RUNNABLE or "file" in b.attributes for b in blocks):
        return []
    workdir = pathlib.Path(tempfile.mkdtemp(prefix=f"doc_{path.stem}_"))
    try:
        return [run_block(block, workdir) for block in blocks if block.runnable or "file" in block.attributes]
    finally:
        if keep:
            print(f"  (scratch folder kept: {workdir})")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def _report(page_outcomes: Iterable[list[Outcome]], outcomes: list[Outcome], quiet: bool) -> None:
    """Print one line per block (failed and skipped ones only when ``quiet``); collect into ``outcomes``."""
    for page in page_outcomes:
        for outcome in page:
            outcomes.append(outcome)
            block = outcome.block
            if outcome.status == "written":
                continue
            label = block.language + (f" x{block.attributes['processes']}" if "processes" in block.attributes else "")
            if outcome.status == "ran":
                if not quiet:
                    print(f"ok      {block.where:32} {label:9} {outcome.seconds:6.1f} s", flush=True)
            elif outcome.status == "skipped":
                print(f"skipped {block.where:32} {label:9} ({outcome.detail})", flush=True)
            else:
                print(f"FAILED  {block.where:32} {label:9} {outcome.seconds:6.1f} s", flush=True)
                print("\n".join("    | " + line for line in outcome.detail[-4000:].splitlines()), flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run the pages named (default: every docs/*.md), print one line per block and a summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pages", nargs="*", type=pathlib.Path, help="Markdown files (default: docs/*.md)")
    parser.add_argument("--list", action="store_true", help="list the blocks and what would happen, run nothing")
    parser.add_argument("--keep", action="store_true", help="keep each page's scratch folder")
    parser.add_argument("--quiet", action="store_true", help="print only failed and skipped blocks, and the summary")
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="pages run at once (each in its own scratch folder; blocks of a page in order)",
    )
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be 1 or more, got {args.jobs}")
    pages = args.pages or default_pages()
    if args.list:
        for page in pages:
            for block in extract_blocks(page):
                action = (
                    f"written to {block.attributes['file']}"
                    if "file" in block.attributes
                    else "runs"
                    if block.runnable
                    else "shown only"
                )
                extra = {k: v for k, v in block.attributes.items() if k != "file"}
                print(f"{block.where:32} {block.language or '-':8} {action} {extra or ''}")
        return 0
    start = time.perf_counter()
    outcomes: list[Outcome] = []
    # Pages are independent (own scratch folder; a launched block picks a free port), so several can run
    # at once; results are printed page by page, in order, as each page's turn comes.
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        page_outcomes = pool.map(lambda page: run_page(page, keep=args.keep), pages)
        _report(page_outcomes, outcomes, quiet=args.quiet)
    counts = {status: sum(o.status == status for o in outcomes) for status in ("ran", "skipped", "failed")}
    print(
        f"doc examples: {counts['ran']} ran, {counts['skipped']} skipped, {counts['failed']} failed "
        f"over {len(pages)} pages in {time.perf_counter() - start:.1f} s"
    )
    if counts["failed"]:
        return 1
    if not counts["ran"]:
        print("no code block ran: is this the right folder?")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
