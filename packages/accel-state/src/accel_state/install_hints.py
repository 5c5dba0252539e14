"""The one place that says how to install something an error message asks for.

The accel distributions are not on the public package index: asking pip for ``accel-train[deepspeed]``
by name fails, and plain ``accel`` from the index is an unrelated project. They install from a clone of the
repository, by folder, with the repository's constraints file, exactly as the top-level README shows.
A third-party package (``lomo-optim``, ``tqdm``) is on the index and installs with a plain
``pip install``. `install_hint()` gives the form that works for each, so every message says it
the same way and none can drift back to an index name that does not exist.

Nothing here imports more than the standard library: the CLI and import-light packages use it.
"""

from __future__ import annotations

import re

__all__ = ["CONSTRAINTS_FILE", "EXTRAS", "install_hint"]

#: The constraints file every install from the repository goes through (relative to the clone's root).
CONSTRAINTS_FILE = "tools/constraints.txt"

#: Every accel distribution -> the extras its ``pyproject.toml`` declares (the ``test`` extra left out:
#: it is for the repository's own CI). A test keeps this table equal to the files.
EXTRAS: dict[str, tuple[str, ...]] = {
    "accel-state": (),
    "accel-data": ("torchdata",),
    "accel-bigmodel": ("hub", "transformers", "timm", "progress"),
    "accel-quant": ("bnb", "bitsandbytes", "transformer-engine", "torchao"),
    "accel-tracking": (
        "tensorboard",
        "wandb",
        "comet_ml",
        "aim",
        "mlflow",
        "clearml",
        "dvclive",
        "trackio",
        "swanlab",
    ),
    "accel-train": ("deepspeed", "megatron", "xla"),
    "accel-launch": ("sagemaker", "rich", "ray"),
    "accel": (
        "torchdata",
        "hub",
        "transformers",
        "timm",
        "progress",
        "bnb",
        "bitsandbytes",
        "transformer-engine",
        "torchao",
        "tensorboard",
        "wandb",
        "comet_ml",
        "aim",
        "mlflow",
        "clearml",
        "dvclive",
        "trackio",
        "swanlab",
        "ray",
        "deepspeed",
        "megatron",
        "sagemaker",
        "rich",
        "all",
    ),
}

_WHERE = "(from the root of a clone of the accel repository)"
# A pip requirement as a message may name it: a name, optional extras, an optional version specifier.
_REQUIREMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9._,-]+\])?([<>=!~][<>=!~.,0-9A-Za-z*+-]*)?$")
_EXTRA = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# Characters a POSIX shell (or zsh, for brackets) reads as its own: such an argument is quoted.
_SHELL_SAFE = re.compile(r"^[A-Za-z0-9._/-]+$")


def _is_accel(distribution: str) -> bool:
    return distribution == "accel" or distribution.startswith("accel-")


def _shell_word(text: str) -> str:
    return text if _SHELL_SAFE.match(text) else f'"{text}"'


def install_hint(distribution: str, extra: str | None = None) -> str:
    """The install command to print in a message asking for ``distribution`` (with ``extra``).

    An accel distribution gives the repository form of the top-level README, which works today:
    ``python3 -m pip install -c tools/constraints.txt "./packages/accel-train[deepspeed]"``, followed
    by where to run it. Any other name is a third-party package on the index and gives the plain
    ``pip install <package>`` (quoted when it holds a version specifier or extras).

    Args:
        distribution: An accel distribution (``"accel-train"``, ``"accel"``) or a third-party
            requirement as pip spells it (``"lomo-optim"``, ``"deepspeed>=0.18.2"``).
        extra: The extra of ``distribution`` to install (``"deepspeed"``); `None` for none.

    Returns:
        One line, ready to follow a colon in an error message.

    Raises:
        ValueError: ``distribution`` is empty or not a requirement pip reads, names an accel
            distribution that does not exist, or ``extra`` is not one that ``distribution`` declares.
    """
    if not isinstance(distribution, str) or not _REQUIREMENT.match(distribution):
        raise ValueError(
            f"install_hint: distribution must be an accel distribution (such as 'accel-train') or a package "
            f"name pip reads (such as 'lomo-optim' or 'deepspeed>=0.18.2'), got {distribution!r}"
        )
    if extra is not None and (not isinstance(extra, str) or not _EXTRA.match(extra)):
        raise ValueError(f"install_hint: extra must be an extra's name such as 'deepspeed' or None, got {extra!r}")
    if _is_accel(distribution):
        return _repository_hint(distribution, extra)
    if extra is not None:
        if "[" in distribution:
            raise ValueError(
                f"install_hint: {distribution!r} already names its extras; pass extra={extra!r} or the "
                "brackets, not both"
            )
        name, specifier = re.match(r"^([A-Za-z0-9._-]+)(.*)$", distribution).groups()  # type: ignore[union-attr]
        distribution = f"{name}[{extra}]{specifier}"
    return f"pip install {_shell_word(distribution)}"


def _repository_hint(distribution: str, extra: str | None) -> str:
    """The README's form for an accel distribution: its folder, the extra in brackets, the constraints."""
    if distribution not in EXTRAS:
        raise ValueError(
            f"install_hint: {distribution!r} is not an accel distribution; the distributions are "
            f"{sorted(EXTRAS)} (an extra goes in extra=, not in brackets)"
        )
    target = f"./packages/{distribution}"
    if extra is not None:
        declared = EXTRAS[distribution]
        if extra not in declared:
            offers = f"its extras are {list(declared)}" if declared else "it declares no extras"
            raise ValueError(f"install_hint: {distribution} has no extra {extra!r}; {offers}")
        target = f"{target}[{extra}]"
    return f"python3 -m pip install -c {CONSTRAINTS_FILE} {_shell_word(target)} {_WHERE}"
