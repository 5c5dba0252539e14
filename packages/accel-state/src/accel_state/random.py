"""Seeding every random number generator and keeping them in step across processes."""

from __future__ import annotations

import random as _py_random
from collections.abc import Iterable
from typing import Any

import torch

from accel_state import imports
from accel_state.enums import RNGType


def set_seed(seed: int, device_specific: bool = False, deterministic: bool = False) -> None:
    """Seed python, numpy, torch and every accelerator's generator.

    Args:
        seed: the seed.
        device_specific: add the process index, so each process draws different numbers.
        deterministic: also ask torch for deterministic algorithms (slower, reproducible).
    """
    if device_specific:
        from accel_state.state import PartialState

        seed += PartialState().process_index
    _py_random.seed(seed)
    if imports.is_numpy_available():
        import numpy as np

        np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)  # lazy: only recorded until CUDA is initialised
    for name, available in (
        ("xpu", imports.is_xpu_available),
        ("npu", imports.is_npu_available),
        ("mlu", imports.is_mlu_available),
        ("musa", imports.is_musa_available),
        ("hpu", imports.is_hpu_available),
    ):
        module = getattr(torch, name, None)
        if module is not None and hasattr(module, "manual_seed_all") and available():
            module.manual_seed_all(seed)
    if imports.is_torch_xla_available() and _may_run_on_xla():
        import torch_xla.core.xla_model as xm  # type: ignore[import-not-found]

        xm.set_rng_state(seed)  # torch_xla's own generator, as documented for set_seed
    if deterministic:
        torch.use_deterministic_algorithms(True)


def _may_run_on_xla() -> bool:
    """False once this process's state runs elsewhere (``cpu=True``): then seeding torch_xla would only start
    its runtime (and take a TPU host's chips) for nothing. Before any state exists the run may still be XLA."""
    from accel_state.enums import DistributedType
    from accel_state.state import PartialState

    shared = PartialState._shared_state
    return not shared.get("_initialized") or shared.get("distributed_type") == DistributedType.XLA


def _get_state(rng_type: RNGType, generator: torch.Generator | None) -> torch.Tensor:
    if rng_type == RNGType.TORCH:
        return torch.get_rng_state()
    if rng_type == RNGType.GENERATOR:
        if generator is None:
            raise ValueError("synchronize_rng_state(RNGType.GENERATOR) needs the generator to synchronise")
        return generator.get_state()
    module = getattr(torch, rng_type.value, None)
    if module is None or not hasattr(module, "get_rng_state"):
        raise ValueError(f"cannot synchronise the {rng_type.value} generator: torch.{rng_type.value} is not available")
    return module.get_rng_state()


def _set_state(rng_type: RNGType, state: torch.Tensor, generator: torch.Generator | None) -> None:
    if rng_type == RNGType.TORCH:
        torch.set_rng_state(state)
    elif rng_type == RNGType.GENERATOR:
        assert generator is not None
        generator.set_state(state)
    else:
        getattr(torch, rng_type.value).set_rng_state(state)


def synchronize_rng_state(rng_type: RNGType | str | None = None, generator: torch.Generator | None = None) -> None:
    """Copy the state of one generator from process 0 to every process (no-op in one process).

    Args:
        rng_type: Which generator: `torch`, `cuda`, `xla`, `npu`, `xpu`, `mlu`, `musa`, `hpu`, `sdaa` or
            `generator`.
        generator: The generator to synchronise; `None` uses the one of the RNG type.
    """
    from accel_state.operations import world_size

    if world_size("synchronize_rng_state") == 1:
        return
    import torch.distributed as dist

    kind = RNGType.parse(rng_type or RNGType.TORCH)
    assert isinstance(kind, RNGType)
    state = _get_state(kind, generator)
    backend_device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    moved = state.to(backend_device)
    from accel_state.kept_works import wait_and_keep

    wait_and_keep(dist.broadcast(moved, src=0, async_op=True))
    _set_state(kind, moved.cpu(), generator)


def synchronize_rng_states(rng_types: Iterable[RNGType | str], generator: torch.Generator | None = None) -> None:
    """Synchronise each generator named in ``rng_types`` (see `synchronize_rng_state()`).

    Args:
        rng_types: The generators to synchronise (see `synchronize_rng_state`).
        generator: The generator to synchronise; `None` uses the one of the RNG type.
    """
    for rng_type in rng_types:
        synchronize_rng_state(RNGType.parse(rng_type), generator=generator)  # type: ignore[arg-type]


def get_rng_states(generator: torch.Generator | None = None) -> dict[str, Any]:
    """Every generator's state as plain lists and tensors (saved without pickle by checkpoints)."""
    states: dict[str, Any] = {"random_state": _py_random.getstate(), "torch_manual_seed": torch.get_rng_state()}
    if imports.is_numpy_available():
        import numpy as np

        states["numpy_random_seed"] = np.random.get_state()
    if torch.cuda.is_initialized():
        states["torch_cuda_manual_seed"] = torch.cuda.get_rng_state_all()
    if generator is not None:
        states["generator"] = generator.get_state()
    return states
