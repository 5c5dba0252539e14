"""Plain terminal prompts of the questionnaire: a question, a default in brackets, re-asked until valid.

They read with ``input()``, so they work in any terminal, a pseudo-terminal or a pipe. Choices are
numbered (``([0] This machine, [1] AWS (Amazon SageMaker))``) and accept the number or the text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

_YES = {"y", "yes", "true", "1"}
_NO = {"n", "no", "false", "0"}


def _ask(question: str, convert: Callable[[str], T], default: T | None, error: str) -> T:
    while True:
        answer = input(question).strip()
        if answer == "" and default is not None:
            return default
        try:
            return convert(answer)
        except (ValueError, KeyError):
            print(error)


def ask_text(question: str, default: str | None = None, allow_empty: bool = False) -> str:
    """A free-text answer (the default when left empty)."""
    suffix = f" [{default}]" if default not in (None, "") else ""

    def convert(text: str) -> str:
        if not text and not allow_empty:
            raise ValueError
        return text

    if allow_empty and default is None:
        default = ""
    return _ask(f"{question}{suffix}: ", convert, default, "Please enter a value.")


def ask_int(question: str, default: int | None = None, minimum: int | None = None) -> int:
    """An integer answer, at least ``minimum``."""
    suffix = f" [{default}]" if default is not None else ""

    def convert(text: str) -> int:
        value = int(text)
        if minimum is not None and value < minimum:
            raise ValueError
        return value

    bound = f" (at least {minimum})" if minimum is not None else ""
    return _ask(f"{question}{suffix}: ", convert, default, f"Please enter an integer{bound}.")


def ask_float(question: str, default: float | None = None) -> float:
    suffix = f" [{default}]" if default is not None else ""
    return _ask(f"{question}{suffix}: ", float, default, "Please enter a number.")


def ask_bool(question: str, default: bool = False) -> bool:
    """A yes/no answer; ``[yes/NO]`` shows the default in capitals."""
    hint = "[YES/no]" if default else "[yes/NO]"

    def convert(text: str) -> bool:
        text = text.lower()
        if text in _YES:
            return True
        if text in _NO:
            return False
        raise ValueError

    return _ask(f"{question} {hint}: ", convert, default, "Please enter yes or no.")


def ask_choice(question: str, options: Sequence[str], values: Sequence[Any] | None = None, default: int = 0) -> Any:
    """One of ``options`` by number or by name; returns the matching item of ``values`` (or the option)."""
    values = list(values) if values is not None else list(options)
    listing = ", ".join(f"[{i}] {option}" for i, option in enumerate(options))

    def convert(text: str) -> Any:
        if text.isdigit() and int(text) < len(options):
            return values[int(text)]
        lowered = [option.lower() for option in options]
        if text.lower() in lowered:
            return values[lowered.index(text.lower())]
        raise ValueError

    return _ask(
        f"{question} ({listing}): ",
        convert,
        values[default],
        f"Please enter a number between 0 and {len(options) - 1}.",
    )
