"""tools/deepspeed_cpu_wheel.py: which ops are prebuilt, what the cache is keyed on, and that a wheel
already built is handed out without building (the building itself runs in CI's deepspeed_ops session)."""

from __future__ import annotations

import pathlib
import sys
import threading

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import deepspeed_cpu_wheel


def test_only_the_cpu_ops_the_tests_load_are_prebuilt_for_the_cpu_accelerator() -> None:
    env = deepspeed_cpu_wheel.build_environment({"PATH": "/bin", "DS_BUILD_FUSED_ADAM": "1"}, jobs=2)
    assert env["DS_BUILD_OPS"] == "0"
    assert env["DS_BUILD_CPU_ADAM"] == env["DS_BUILD_SHM_COMM"] == "1"
    assert env["DS_ACCELERATOR"] == "cpu" and env["MAX_JOBS"] == "2" and env["PATH"] == "/bin"
    assert env["CFLAGS"] == "-g0"  # no debug info: after Python's own -g, the last one counts
    assert deepspeed_cpu_wheel.build_environment({"CFLAGS": "-march=native"}, jobs=1)["CFLAGS"] == "-march=native -g0"


def test_the_cache_key_changes_with_the_torch_pin_and_the_deepspeed_asked_for() -> None:
    key = deepspeed_cpu_wheel.cache_key("torch==2.13.0\n", "deepspeed")
    assert key == deepspeed_cpu_wheel.cache_key("torch==2.13.0\n", "deepspeed")
    assert key != deepspeed_cpu_wheel.cache_key("torch==2.9.0\n", "deepspeed")
    assert key != deepspeed_cpu_wheel.cache_key("torch==2.13.0\n", "deepspeed==0.18.0")


def test_a_built_wheel_is_handed_out_without_building(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("torch==2.13.0\n")
    folder = tmp_path / "cache" / deepspeed_cpu_wheel.cache_key(constraints.read_text(), "deepspeed")
    (folder / "dist").mkdir(parents=True)
    wheel = folder / "dist" / "deepspeed-0.19.8-cp311-cp311-linux_x86_64.whl"
    wheel.write_bytes(b"")

    def no_build(*args: object) -> pathlib.Path:
        raise AssertionError("built although a wheel was there")

    monkeypatch.setattr(deepspeed_cpu_wheel, "build", no_build)
    assert deepspeed_cpu_wheel.cached_or_built(tmp_path / "cache", str(constraints), "deepspeed", 2) == wheel


def test_callers_at_the_same_time_wait_for_one_build(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    builds = []

    def fake_build(folder: pathlib.Path, constraints: list[str], requirement: str, jobs: int) -> pathlib.Path:
        builds.append(folder)
        (folder / "dist").mkdir()
        threading.Event().wait(0.3)  # long enough for the other caller to reach the lock
        wheel = folder / "dist" / "deepspeed-0.0.0-py3-none-any.whl"
        wheel.write_bytes(b"")
        return wheel

    monkeypatch.setattr(deepspeed_cpu_wheel, "build", fake_build)
    results: list[pathlib.Path] = []
    callers = [
        threading.Thread(
            target=lambda: results.append(deepspeed_cpu_wheel.cached_or_built(tmp_path, None, "deepspeed", 1))
        )
        for _ in range(2)
    ]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join()
    assert len(builds) == 1 and len(results) == 2 and results[0] == results[1]
