"""Ray Train's ``TorchTrainer`` running an accel script (``examples/ray_train.py``) on 2 CPU workers.

The same training function under ``accel launch --cpu --num_processes 2`` and under Ray gives the
same final parameters; a worker SIGKILLed in the middle of an epoch under ``FailureConfig(max_failures=1)``
restarts from the last reported ``save_state`` checkpoint and ends with the same parameters again.
While Ray runs, no socket of its processes talks to anything but 127.0.0.1 (``ss -tunap``, when present).
Runs in the ``ray`` nox session (ray installed); skipped elsewhere.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import ROOT, accel_command, run_command

pytest.importorskip("ray.train.torch")

import torch
from safetensors.torch import load_file

EXAMPLE = str(ROOT / "examples" / "ray_train.py")
TIMEOUT = 900

DRIVER = """
import sys
sys.path.insert(0, {examples!r})
import ray_train

ray_train.loopback_only(num_cpus=3)
for out, kill in ((sys.argv[1], None), (sys.argv[2], "2:3:1")):
    result = ray_train.run_with_ray({{"out": out, "kill_at": kill}}, workers=2, max_failures=1)
    assert result.error is None, result.error
    print("RAY RUN DONE", out, flush=True)
"""


def _descendants(root: int) -> set[int]:
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        for child, parent in parents.items():
            if parent == pid and child not in found:
                found.add(child)
                frontier.append(child)
    return found


def _off_loopback(lines: list[str], pids: set[int]) -> list[str]:
    """The socket lines of ``pids`` whose peer is neither loopback nor a wildcard."""
    bad = []
    for line in lines:
        owners = {int(pid) for pid in re.findall(r"pid=(\d+)", line)}
        if not owners & pids:
            continue
        fields = line.split()
        if len(fields) < 6:
            continue
        peer = fields[5]
        host = peer.rsplit(":", 1)[0].strip("[]")
        if host.startswith("::ffff:"):
            host = host[7:]
        if host in ("*", "0.0.0.0", "::", "::1") or host.startswith("127."):
            continue
        bad.append(line)
    return bad


def test_ray_train_matches_accel_launch_and_resumes_a_killed_worker_exactly(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    launched = run_command(
        [*accel_command(), "launch", "--cpu", "--num_processes", "2", EXAMPLE, "--plain", "--out", str(plain)],
        timeout=TIMEOUT,
    )
    assert launched.returncode == 0, launched.stderr[-4000:]
    expected = load_file(str(plain / "final.safetensors"))

    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER.format(examples=str(ROOT / "examples")))
    runs = [tmp_path / "ray", tmp_path / "ray_killed"]
    for run in runs:
        run.mkdir()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "RAY_DEDUP_LOGS": "0"}
    # Ray's workers import train_func by module name: they find it through PYTHONPATH.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "examples"), os.environ.get("PYTHONPATH")]))
    process = subprocess.Popen(
        [sys.executable, str(driver), *map(str, runs)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
    )
    seen: list[str] = []
    ss = shutil.which("ss")

    def watch() -> None:
        while process.poll() is None:
            if ss:
                lines = subprocess.run([ss, "-tunap"], capture_output=True, text=True, check=False).stdout.splitlines()
                seen.extend(_off_loopback(lines, _descendants(process.pid)))
            time.sleep(1.0)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        out, _ = process.communicate(timeout=TIMEOUT)
    finally:
        if process.poll() is None:
            process.kill()
    watcher.join(timeout=10)
    assert process.returncode == 0, out[-6000:]
    assert out.count("RAY RUN DONE") == 2
    assert (runs[1] / "killed_once").exists()  # the fault really happened
    # From the last checkpoint Ray had registered when the worker died (epoch 1 or 2 done).
    assert re.search(r"resumed from epoch [12]\b", out), out[-6000:]
    for run in runs:
        got = load_file(str(run / "final.safetensors"))
        assert got.keys() == expected.keys()
        assert all(torch.equal(got[key], expected[key]) for key in expected), run
    assert not seen, "Ray talked to something other than 127.0.0.1:\n" + "\n".join(sorted(set(seen))[:20])
