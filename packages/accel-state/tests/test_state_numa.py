"""``override_numa_affinity`` / ``set_numa_affinity``: pin to the CPUs near the GPU, nothing without CUDA."""

from __future__ import annotations

import os

import pytest

from accel_state import environment, imports


@pytest.mark.skipif(imports.is_cuda_available(), reason="checks the machine without CUDA")
def test_without_cuda_both_leave_the_affinity_alone() -> None:
    before = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    assert environment.override_numa_affinity(0, verbose=True) is None
    assert environment.set_numa_affinity(0) is None
    if before is not None:
        assert os.sched_getaffinity(0) == before


def test_cuda_without_pynvml_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("CPU affinity is a Linux call")
    monkeypatch.setattr(imports, "is_cuda_available", lambda: True)
    monkeypatch.setattr(imports, "is_pynvml_available", lambda: False)
    with pytest.raises(ImportError, match=r"`pynvml` package must be available \(`pip install pynvml`\)"):
        environment.override_numa_affinity(0)
    with pytest.raises(ImportError, match="pynvml"):
        environment.set_numa_affinity(1)  # not remembered as done: it failed


def test_documented_module_path() -> None:
    documented = pytest.importorskip("accel.utils.environment", reason="needs the accel meta-package")

    assert documented.override_numa_affinity is environment.override_numa_affinity
    assert documented.set_numa_affinity is environment.set_numa_affinity
