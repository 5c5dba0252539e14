"""How a client run's figures are compared with the documented system's, recorded on another machine.

The reference figures (reference/CASE.json) were recorded once, on one machine; the test runs on any
machine. The same float32 program gives other last bits on another CPU: its kernels add in another order
(vector width, BLAS blocking, thread split), and a few training steps carry those differences into every
weight. So two kinds of figure are compared two ways:

* **Exact**: what is the same program on both sides whatever the kernels: step counts, world size,
  checkpoint names, event files, which figures exist.
* **Within a tolerance**: losses, rewards and parameter digests. A loss or reward is compared to its own
  size, or to ``floor`` when it is smaller (``scalar``). A digest is each tensor's sum and sum of
  magnitudes. Reordering noise does not spread evenly over a model: Adam moves every weight by about the
  learning rate whatever its gradient's size, so a weight whose gradient is nearly zero (a bias that
  started at zero, say) can move the other way on another CPU, while large tensors barely change. So a
  digest is compared twice: over the whole model (the sum over tensors of how far each sum and each sum
  of magnitudes moved, relative to the model's sum of magnitudes: ``model``, tight), and per tensor
  (relative to that tensor's sum of magnitudes, or to 1% of the mean tensor's when smaller: ``tensor``,
  loose, for the few near-zero tensors). A
  changed training step moves every tensor and shows in the first; a tensor gone wrong alone, in the
  second. The sha256 of the parameters is the same only on the same machine and is not compared.

How the tolerances were chosen: every case was run on this repository's machines with the kernels of
other CPUs forced (``ATEN_CPU_CAPABILITY=default``, ``MKL_ENABLE_INSTRUCTIONS=SSE4_2``,
``ONEDNN_MAX_CPU_ISA=SSE41``: other vector widths and BLAS blocking), and against the figures recorded on
another machine (tools/client_figure_spread.py prints the largest deviation of each kind). Each tolerance
sits several times above the largest deviation seen and below what one changed training step does
(``test_more_clients.py::test_a_changed_training_step_fails_the_comparison``). In float32 the margins are
wide (noise about 1e-6; one more learning-rate step, after step 4: 1.8e-2 over the model, 1e-2 on a loss); in
bfloat16 autocast they are narrower (noise up to 3.5e-5 over the model and 1.1e-3 on a loss, one skipped
batch 9e-4 and 0.15). A dropped EMA update moves the EMA weights by less than bfloat16 noise does, so the
diffusers runs also record how many EMA updates were made, compared exactly. The figures are in the note
of issue 34.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

#: A tensor is compared relative to its own sum of magnitudes, or to this share of the mean tensor's when
#: it is smaller: a tensor whose gradient is zero in exact arithmetic (an attention key's bias: softmax
#: ignores a constant added to a row) holds only rounding noise, of 1e-7, relative to which any change is
#: large.
TENSOR_FLOOR_SHARE = 0.01

#: Figures that are timings (compared by tools/bench/clients.py, never here).
TIMINGS = ("steps_per_second", "cpu_seconds_per_step")


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """How far a run's figures may be from the reference's.

    Args:
        scalar: Largest ``|ours - reference|`` of a loss or reward, relative to ``max(|reference|, floor)``.
        floor: The size below which a loss or reward is compared absolutely (``scalar * floor``).
        model: Largest movement of a digest's sums (added over its tensors), relative to its total sum of
            magnitudes; once for the sums, once for the sums of magnitudes.
        tensor: Largest movement of one tensor's sum or sum of magnitudes, relative to its sum of magnitudes.
    """

    scalar: float
    floor: float
    model: float
    tensor: float


#: float32 training (TRL, sentence-transformers).
FLOAT32 = Tolerance(scalar=2e-5, floor=0.1, model=2e-5, tensor=1e-3)
#: bfloat16 autocast (diffusers): one value that rounds to another bfloat16 moves by 2**-8 of itself.
BFLOAT16 = Tolerance(scalar=1e-2, floor=0.1, model=2.5e-4, tensor=0.2)


def _is_digest(value: Any) -> bool:
    return isinstance(value, dict) and "sums" in value and "sha256" in value


def _is_floats(value: Any) -> bool:
    return isinstance(value, float) or (isinstance(value, list) and bool(value) and isinstance(value[0], float))


def _scalar_deviation(ours: float, reference: float, tolerance: Tolerance) -> float:
    return abs(ours - reference) / max(abs(reference), tolerance.floor)


def _walk(ours: Any, reference: Any, tolerance: Tolerance, where: str, out: list[tuple[str, str, float]]) -> None:
    """Append ``(where, kind, deviation)`` per compared number; a deviation of ``inf`` is a mismatch."""
    if _is_digest(reference):
        if not _is_digest(ours) or ours["sums"].keys() != reference["sums"].keys():
            out.append((f"{where}: tensor names differ", "exact", math.inf))
            return
        moved_sums = moved_magnitudes = 0.0
        scale = max(sum(magnitude for _, magnitude in reference["sums"].values()), 1e-12)
        smallest = TENSOR_FLOOR_SHARE * scale / len(reference["sums"])
        for name, (total, magnitude) in reference["sums"].items():
            our_total, our_magnitude = ours["sums"][name]
            moved_sums += abs(our_total - total)
            moved_magnitudes += abs(our_magnitude - magnitude)
            deviation = max(abs(our_total - total), abs(our_magnitude - magnitude)) / max(magnitude, smallest)
            out.append((f"{where}.{name}: {[our_total, our_magnitude]} vs {[total, magnitude]}", "tensor", deviation))
        label = f"{where}: all tensors (sums moved {moved_sums:.4g}, magnitudes {moved_magnitudes:.4g}, of {scale:.4g})"
        out.append((label, "model", max(moved_sums, moved_magnitudes) / scale))
    elif isinstance(reference, dict):
        if not isinstance(ours, dict) or not ours.keys() >= reference.keys():
            missing = sorted(set(reference) - set(ours)) if isinstance(ours, dict) else "all"
            out.append((f"{where}: figures missing {missing}", "exact", math.inf))
            return
        for key, value in reference.items():
            if key not in TIMINGS:
                _walk(ours[key], value, tolerance, f"{where}.{key}", out)
    elif _is_floats(reference):
        mine, theirs = (ours, reference) if isinstance(reference, list) else ([ours], [reference])
        if not isinstance(mine, list) or len(mine) != len(theirs) or not all(isinstance(v, float) for v in mine):
            out.append((f"{where}: {ours} vs {reference}", "exact", math.inf))
            return
        for index, (a, b) in enumerate(zip(mine, theirs)):
            label = f"{where}[{index}]" if isinstance(reference, list) else where
            out.append((f"{label}: {a} vs {b}", "scalar", _scalar_deviation(a, b, tolerance)))
    elif ours != reference:
        out.append((f"{where}: {ours!r} vs {reference!r}", "exact", math.inf))


def differences(ours: Any, reference: Any, tolerance: Tolerance, where: str = "") -> list[str]:
    """Every figure of ``ours`` that is not the reference's within ``tolerance``, one line each (none: equal).

    Args:
        ours: The figures of the run on accel (a file's JSON).
        reference: The recorded figures of the same run on the documented system.
        tolerance: How far losses, rewards and digests may be.
        where: A prefix for the lines (the case and file).
    """
    found: list[tuple[str, str, float]] = []
    _walk(ours, reference, tolerance, where, found)
    limits = {"scalar": tolerance.scalar, "model": tolerance.model, "tensor": tolerance.tensor, "exact": 0.0}
    return [
        f"{label} (deviation {deviation:.3g}, allowed {limits[kind]:.3g})"
        for label, kind, deviation in found
        if deviation > limits[kind]
    ]


def spread(ours: Any, reference: Any, tolerance: Tolerance) -> dict[str, float]:
    """The largest deviation of each kind (``scalar``, ``model``, ``tensor``) between two runs' figures.

    Args:
        ours: One run's figures.
        reference: The other's.
        tolerance: Gives the floor of scalar figures.
    """
    found: list[tuple[str, str, float]] = []
    _walk(ours, reference, tolerance, "", found)
    largest = {"scalar": 0.0, "model": 0.0, "tensor": 0.0}
    for _, kind, deviation in found:
        if kind in largest:
            largest[kind] = max(largest[kind], deviation)
    return largest
