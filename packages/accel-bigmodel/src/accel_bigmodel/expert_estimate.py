"""The memory estimate of a mixture-of-experts model whose experts are split over ``ep_size`` processes
(``accel estimate-memory --ep_size N``).

Expert parallelism gives each process ``num_experts / ep_size`` experts of every expert module (see
`accel_bigmodel.experts` for what one is) and the whole of everything else, so per process the expert
parameters count ``1 / ep_size`` and the rest counts in full. As in the ordinary estimate, sizes are taken
in float32 and divided for the other dtypes, and training with Adam counts four times the weights held.
"""

from __future__ import annotations

from math import gcd
from typing import NamedTuple

from torch import nn

from accel_bigmodel.estimate import ALL_DTYPES, DTYPE_DIVISORS, convert_bytes, float32_factor, markdown_table
from accel_bigmodel.experts import ExpertModule, find_expert_modules
from accel_bigmodel.sizes import compute_module_sizes

__all__ = [
    "ExpertParallelRow",
    "check_ep_size",
    "estimate_expert_parallel_memory",
    "format_expert_parallel_table",
]


class ExpertParallelRow(NamedTuple):
    """Memory figures (bytes, per process) for one dtype with the experts split over ``ep_size`` processes."""

    dtype: str
    #: the expert parameters one process holds (all of them / ``ep_size``)
    experts: int
    #: every other parameter and buffer (each process holds them all)
    rest: int
    #: ``experts + rest``
    total_size: int
    #: four times ``total_size``: weights, gradients and Adam's two states
    training: int


def check_ep_size(ep_size: object) -> None:
    """Raise unless ``ep_size`` is an int >= 1.

    Args:
        ep_size: The number of processes the experts are split over.

    Raises:
        ValueError: ``ep_size`` is not an int, or is below 1.
    """
    if isinstance(ep_size, bool) or not isinstance(ep_size, int) or ep_size < 1:
        raise ValueError(
            f"ep_size (--ep_size) must be an integer >= 1, the number of processes the experts are split over; "
            f"got {ep_size!r}."
        )


def _check_fits(ep_size: int, experts: list[ExpertModule], model_name: str) -> None:
    """Raise unless the model (``model_name`` in the message) has an expert module and ``ep_size`` divides
    the expert count of each."""
    if not experts:
        raise ValueError(
            f"ep_size={ep_size} (--ep_size) splits the experts of a mixture-of-experts model, but {model_name} has "
            "no expert module (a module with an int `num_experts`, called with the hidden states, the chosen "
            "experts and their weights: see accel_bigmodel.experts); leave --ep_size out for a dense model."
        )
    uneven = [e for e in experts if e.num_experts % ep_size]
    if uneven:
        first = uneven[0]
        more = f" (nor those of {len(uneven) - 1} more expert modules)" if len(uneven) > 1 else ""
        common = 0
        for expert in experts:
            common = gcd(common, expert.num_experts)
        fitting = [d for d in range(1, common + 1) if common % d == 0]
        raise ValueError(
            f"ep_size={ep_size} (--ep_size) does not divide the {first.num_experts} experts of "
            f"{first.name or 'the model'!r}{more}: each process must hold the same number of experts of every "
            f"expert module; choose one of {fitting}."
        )


def estimate_expert_parallel_memory(
    model: nn.Module,
    ep_size: int,
    dtypes: list[str] | tuple[str, ...] = ALL_DTYPES,
    *,
    model_name: str | None = None,
) -> list[ExpertParallelRow]:
    """Per-process bytes of the experts and of the rest of ``model``, its total and the Adam training
    estimate, for each dtype, with the experts split over ``ep_size`` processes.

    Args:
        model: The model (an `nn.Module`, on the meta device or any other).
        ep_size: The number of processes the experts are split over (1: none).
        dtypes: The dtypes to estimate for (`float32`, `float16`, `int8`, `int4`, ...).
        model_name: The model's name for error messages (`None`: "the model").

    Raises:
        ValueError: ``ep_size`` is not an int >= 1, ``model`` has no expert module while ``ep_size`` > 1,
            ``ep_size`` does not divide the expert count of one of its expert modules (named), or a dtype
            is unknown.
    """
    check_ep_size(ep_size)
    unknown = [d for d in dtypes if d not in DTYPE_DIVISORS]
    if unknown:
        raise ValueError(f"Unknown dtypes {unknown}: choose among {list(DTYPE_DIVISORS)}.")
    experts = find_expert_modules(model)
    if ep_size > 1:
        _check_fits(ep_size, experts, "the model" if model_name is None else repr(model_name))
    sizes = compute_module_sizes(model)  # a shared tensor counts once, under its first name
    expert_bytes = sum(sizes.get(name, 0) for expert in experts for name in expert.parameters)
    to_float32 = float32_factor(model)
    experts_fp32 = int(expert_bytes * to_float32)
    rest_fp32 = int(sizes[""] * to_float32) - experts_fp32
    rows = []
    for dtype in dtypes:
        divisor = DTYPE_DIVISORS[dtype]
        held = experts_fp32 // ep_size // divisor
        rest = rest_fp32 // divisor
        rows.append(ExpertParallelRow(dtype, held, rest, held + rest, 4 * (held + rest)))
    return rows


def format_expert_parallel_table(model_name: str, rows: list[ExpertParallelRow], ep_size: int) -> str:
    """The markdown table ``accel estimate-memory --ep_size N`` prints (bytes per process).

    Args:
        model_name: The model as the user named it.
        rows: The rows of `estimate_expert_parallel_memory()`.
        ep_size: The number of processes the experts are split over.
    """
    header = ["dtype", "Experts", "Rest", "Total Size", "Training using Adam"]
    cells = [
        [
            r.dtype,
            convert_bytes(r.experts),
            convert_bytes(r.rest),
            convert_bytes(r.total_size),
            convert_bytes(r.training),
        ]
        for r in rows
    ]
    title = f"Memory Usage per process for loading `{model_name}` with its experts split over {ep_size} processes:"
    return markdown_table(title, header, cells)
