"""accel's own tracker: one JSON-lines file per run, no dependency, readable by any tool.

Each line is one JSON object: ``{"event": "config", "time": ..., "values": {...}}`` for
``store_init_configuration`` and ``{"event": "log", "step": ..., "time": ..., "values": {...}}`` for each
``log`` call. Lines are flushed as they are written, so a crash keeps everything logged before it.
NaN and infinities are written as the strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"`` (strict JSON).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from typing import IO, Any

from accel_tracking.general import BackendTracker
from accel_tracking.values import strict_json

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


class JSONLRun:
    """The open run file of a `JSONLTracker` (what ``tracker`` returns)."""

    def __init__(self, path: str, append: bool) -> None:
        self.path = path
        self._file: IO[str] | None = open(path, "a" if append else "x", encoding="utf-8")  # noqa: SIM115

    def write(self, record: dict[str, Any]) -> None:
        """Append one JSON object as a line and flush it to the file."""
        if self._file is None:
            raise RuntimeError(f"The JSON-lines run {self.path} is closed.")
        try:  # the common case: plain numbers and strings, encoded as they are
            line = json.dumps(record, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError):  # NaN/inf, tensors, paths...: spelled out as strict JSON
            line = json.dumps(strict_json(record), ensure_ascii=False, allow_nan=False)
        self._file.write(line + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    @property
    def closed(self) -> bool:
        return self._file is None


class JSONLTracker(BackendTracker):
    """Writes ``<logging_dir>/<run_name>.jsonl``: the config, then one line per ``log`` call.

    Args:
        run_name: the run's (project's) name; it names the file.
        logging_dir: the directory that holds the file (created when missing).
        resume: append to an existing file of that name instead of starting a new one. Without it an
            existing file is kept and the new run goes to ``<run_name>-1.jsonl``, ``-2`` and so on.
        **kwargs: Accepted and ignored, so that `init_kwargs` meant for other trackers do no harm.
    """

    name = "jsonl"
    requires_logging_directory = True
    extra = ""

    def __init__(self, run_name: str, logging_dir: str | os.PathLike, resume: bool = False, **kwargs: Any) -> None:
        if logging_dir is None:
            raise ValueError("The jsonl tracker writes into a directory: pass `logging_dir` (project_dir=...).")
        if kwargs:
            raise TypeError(
                f"The jsonl tracker takes `logging_dir` and `resume` only; unknown arguments: {sorted(kwargs)}"
            )
        super().__init__(run_name)
        self.logging_dir = os.fspath(logging_dir)
        self.resume = resume

    def _path(self) -> str:
        stem = _UNSAFE.sub("_", str(self.run_name or "run")).strip("._") or "run"
        path = os.path.join(self.logging_dir, f"{stem}.jsonl")
        if self.resume:
            return path
        index = 0
        while os.path.exists(path):
            index += 1
            path = os.path.join(self.logging_dir, f"{stem}-{index}.jsonl")
        return path

    def _start(self) -> JSONLRun:
        os.makedirs(self.logging_dir, exist_ok=True)
        return JSONLRun(self._path(), append=self.resume)

    def _store_config(self, config: dict[str, Any]) -> None:
        self._run.write({"event": "config", "time": time.time(), "values": config})

    def _log(self, values: dict[str, Any], step: int | None, **kwargs: Any) -> None:
        record: dict[str, Any] = {"event": "log", "step": step, "time": time.time(), "values": values}
        if kwargs:
            record["kwargs"] = kwargs
        self._run.write(record)

    def _finish(self) -> None:
        self._run.close()

    @property
    def path(self) -> str | None:
        """The file this run writes to (``None`` before the run started)."""
        return None if self._run is None else self._run.path


def read_jsonl(path: str | os.PathLike) -> Iterator[dict[str, Any]]:
    """The records of a JSON-lines run file, in order.

    Args:
        path: The `.jsonl` file a `JSONLTracker` wrote.
    """
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                yield json.loads(line)
