"""Checking and normalising one option value, from a config file or from the command line.

Pure functions: a value of the wrong type raises `ConfigError` naming the key and the
expected type; a misspelt key raises one naming the closest valid key.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

_TRUE = {"y", "yes", "t", "true", "on", "1"}
_FALSE = {"n", "no", "f", "false", "off", "0"}

EXPECTED = {
    "switch": "a boolean (true or false)",
    "bool": "a boolean (true or false)",
    "bool_or_str": "a boolean or a string",
    "int": "an integer",
    "float": "a number",
    "str": "a string",
    "list": "a list of strings (or one comma-separated string)",
    "int_or_auto": "an integer or 'auto'",
    "float_or_auto": "a number or 'auto'",
    "bool_triple": "three booleans (fprop, dgrad, wgrad)",
    "dict": "a mapping of keys to values",
}


class ConfigError(ValueError):
    """A config file or a set of launch flags that cannot be used; the message says what to change."""


def closest(word: str, candidates: Iterable[str]) -> str | None:
    """The candidate closest to ``word`` (a likely misspelling), or None when nothing is close."""
    matches = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return matches[0] if matches else None


def unknown_key_error(key: str, valid: Iterable[str], where: str) -> ConfigError:
    """Error for an unknown ``key`` in ``where``, suggesting the closest valid key."""
    return unknown_keys_error([key], valid, where)


def unknown_keys_error(keys: Iterable[str], valid: Iterable[str], where: str) -> ConfigError:
    """One error naming every unknown key of ``keys`` in ``where``, each with the closest valid key.

    Args:
        keys: the unknown keys, in the order they were found.
        valid: the keys ``where`` accepts.
        where: what holds the keys (``config file x.yaml``, ``..., section 'fsdp_config'``).

    Returns:
        The `ConfigError` to raise (the user fixes every key in one go, not one per run).
    """
    valid = sorted(valid)
    named = []
    for key in keys:
        guess = closest(key, valid)
        named.append(f"{key!r} (did you mean {guess!r}?)" if guess else repr(key))
    noun = "key" if len(named) == 1 else f"{len(named)} keys"
    return ConfigError(f"{where}: unknown {noun} {', '.join(named)} (valid keys: {', '.join(valid)})")


def _bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    return None


def coerce(kind: str, value: Any, key: str, where: str) -> Any:
    """``value`` checked against ``kind`` and normalised; a ConfigError naming ``key`` when it does not fit."""
    if value is None:
        return None

    def bad() -> ConfigError:
        return ConfigError(f"{where}: {key!r} must be {EXPECTED[kind]}, got {value!r} ({type(value).__name__})")

    if kind in ("switch", "bool"):
        result = _bool(value)
        if result is None:
            raise bad()
        return result
    if kind == "bool_or_str":
        if isinstance(value, (bool, str)):
            return value
        raise bad()
    if kind == "int":
        if isinstance(value, bool):
            raise bad()
        if isinstance(value, int):
            return value
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            return int(value)
        raise bad()
    if kind == "float":
        if isinstance(value, bool):
            raise bad()
        if isinstance(value, (int, float)):
            return float(value)
        try:
            return float(value)
        except (TypeError, ValueError):
            raise bad() from None
    if kind in ("int_or_auto", "float_or_auto"):
        if isinstance(value, str) and value.strip().lower() == "auto":
            return "auto"
        return coerce(kind.split("_")[0], value, key, where)
    if kind == "str":
        if isinstance(value, (bool, dict, list)):
            raise bad()
        return str(value)
    if kind == "list":
        if isinstance(value, str):
            return [item.strip() for item in value.split(",") if item.strip()]
        if isinstance(value, (list, tuple)) and all(isinstance(item, (str, int, float)) for item in value):
            return [str(item) for item in value]
        raise bad()
    if kind == "bool_triple":
        if isinstance(value, str):
            items: list[Any] = [item for item in value.replace("(", "").replace(")", "").split(",") if item.strip()]
        elif isinstance(value, (list, tuple)):
            items = list(value)
        else:
            single = _bool(value)
            if single is None:
                raise bad()
            items = [single] * 3
        parsed = [_bool(item) for item in items]
        if len(parsed) != 3 or any(item is None for item in parsed):
            raise bad()
        return tuple(parsed)
    if kind == "dict":
        if not isinstance(value, dict):
            raise bad()
        return dict(value)
    raise ValueError(f"unknown value kind {kind!r}")


def check_choice(value: Any, choices: Iterable[str] | None, key: str, where: str) -> Any:
    """``value`` if it is one of ``choices`` (compared case-insensitively), else a ConfigError listing them."""
    if value is None or choices is None:
        return value
    choices = list(choices)
    text = str(value)
    for choice in choices:
        if text.lower() == choice.lower():
            return type(value)(choice) if isinstance(value, str) else value
    raise ConfigError(f"{where}: {key!r} must be one of {', '.join(choices)}; got {value!r}")
