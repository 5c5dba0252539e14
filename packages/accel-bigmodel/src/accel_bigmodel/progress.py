"""Progress bars for long loads: tqdm, only on the local main process and only on a terminal."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

from accel_state.imports import is_tqdm_available

T = TypeVar("T")


def _local_main() -> bool:
    return os.environ.get("LOCAL_RANK", "0") == "0"


def progress(items: Iterable[T], total: int | None = None, desc: str = "", enabled: bool | None = None) -> Iterable[T]:
    """``items``, wrapped in a tqdm bar when tqdm is installed, this is the local main process and stderr is a terminal."""
    if enabled is None:
        enabled = sys.stderr.isatty() and _local_main()
    if not enabled or not is_tqdm_available():
        return items
    from tqdm.auto import tqdm

    return tqdm(items, total=total, desc=desc, leave=False)


def iterate(items: Iterable[T]) -> Iterator[T]:
    yield from items
