"""Pure conversions between what a user logs and what a tracking backend accepts.

Users log tensors, numpy scalars and nested configs; backends want Python numbers, and some of them
(TensorBoard's hparams, MLflow params, ClearML) only scalar hyper-parameters. Nothing here imports
torch or numpy: values are recognised by shape (an ``item()`` method and a single element).
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import math
import os
from collections.abc import Mapping
from typing import Any

Scalar = bool | int | float | str

_PLAIN = (bool, int, float, str, type(None))


def _single_element(value: Any) -> bool:
    """True for a 0-d / one-element tensor or array (anything with ``item`` and one element)."""
    if getattr(value, "ndim", None) == 0:
        return True
    numel = getattr(value, "numel", None)
    if callable(numel):
        try:
            return int(numel()) == 1
        except Exception:
            return False
    size = getattr(value, "size", None)
    return isinstance(size, int) and size == 1


def to_python(value: Any) -> Any:
    """A tensor or numpy scalar (one element) becomes the Python number it holds; anything else is unchanged."""
    if isinstance(value, _PLAIN):
        return value
    item = getattr(value, "item", None)
    if callable(item) and _single_element(value):
        try:
            return item()
        except Exception:  # a tensor whose item() fails (meta device...) is left for the backend to judge
            return value
    return value


def _as_mapping(values: Any, what: str) -> Mapping[str, Any]:
    if isinstance(values, Mapping):
        return values
    if isinstance(values, argparse.Namespace):
        return vars(values)
    if dataclasses.is_dataclass(values) and not isinstance(values, type):
        return dataclasses.asdict(values)
    raise TypeError(
        f"{what} must be a dict of name -> value (or an argparse.Namespace / dataclass instance), "
        f"got {type(values).__name__}: {values!r:.200}"
    )


def normalize_values(values: Any) -> dict[str, Any]:
    """``values`` of one ``log`` call: a fresh dict with string keys and tensors/numpy scalars turned into numbers.

    Nested dicts (TensorBoard's grouped scalars) are converted one level deep.
    """
    out: dict[str, Any] = {}
    for key, value in _as_mapping(values, "The values to log").items():
        if isinstance(value, Mapping):
            out[str(key)] = {str(k): to_python(v) for k, v in value.items()}
        else:
            out[str(key)] = to_python(value)
    return out


def to_jsonable(value: Any) -> Any:
    """``value`` made of dicts, lists, str, int, float, bool and None only (tensors become numbers or lists).

    Anything else (paths, enums, classes, functions) becomes its string form, so no config is ever rejected.
    """
    value = to_python(value)
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, enum.Enum):
        return to_jsonable(value.value)
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, argparse.Namespace):
        return to_jsonable(vars(value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_jsonable(dataclasses.asdict(value))
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        try:
            return to_jsonable(tolist())
        except Exception:
            pass
    return str(value)


def normalize_config(config: Any) -> dict[str, Any]:
    """A hyper-parameter config as a JSON-able dict with string keys (any nesting kept)."""
    return {str(k): to_jsonable(v) for k, v in _as_mapping(config, "The configuration").items()}


def flatten(config: Mapping[str, Any], sep: str = "/") -> dict[str, Any]:
    """Nested dicts become one level, their keys joined with ``sep``: ``{"a": {"b": 1}} -> {"a/b": 1}``.

    An empty nested dict is kept as a value (``{}``) so that no key disappears.
    """
    out: dict[str, Any] = {}

    def visit(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping) and value:
            for key, inner in value.items():
                visit(f"{prefix}{sep}{key}" if prefix else str(key), inner)
        else:
            out[prefix] = value

    for key, value in config.items():
        visit(str(key), value)
    return out


def scalar_config(config: Any, sep: str = "/") -> dict[str, Scalar]:
    """A config for a backend whose hyper-parameter store takes scalars only.

    Nested dicts are flattened (keys joined with ``sep``); lists and empty dicts become their JSON text;
    ``None`` becomes ``"None"``; numbers, strings and booleans are kept.
    """
    out: dict[str, Scalar] = {}
    for key, value in flatten(normalize_config(config), sep=sep).items():
        if value is None:
            out[key] = "None"
        elif isinstance(value, (bool, int, float, str)):
            out[key] = value
        else:
            out[key] = json.dumps(value, sort_keys=True, default=str)
    return out


def string_config(config: Any, sep: str = "/") -> dict[str, str]:
    """Like `scalar_config()` with every value as text (for stores that keep strings only)."""
    return {key: value if isinstance(value, str) else str(value) for key, value in scalar_config(config, sep).items()}


def is_number(value: Any) -> bool:
    """True for an int or float (bool excluded), the values a metric store accepts."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def json_number(value: float) -> float | str:
    """A float as strict JSON allows it: NaN and infinities become the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value


def strict_json(value: Any) -> Any:
    """`to_jsonable()` plus strict-JSON floats, for files any JSON reader can parse."""
    value = to_jsonable(value)
    if isinstance(value, float):
        return json_number(value)
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [strict_json(v) for v in value]
    return value
