"""Every checkpoint file accel-train reads or writes goes through its checkpoint package.

The safety checks (planted pickles refused, damaged files named, writes atomic) live in
``accel_train/checkpoint/``; a backend that read or wrote a file itself would skip them, as the pipeline
and Megatron backends once did. This test reads the source of every other module and fails on a call
(or an import) of a file reader or writer of the formats checkpoints use.
"""

from __future__ import annotations

import ast
import pathlib

import accel_train

PACKAGE = pathlib.Path(accel_train.__file__).parent
CHECKPOINT_PACKAGE = PACKAGE / "checkpoint"

#: Dotted call targets that read or write a checkpoint file (matched on their last two parts, or the
#: last part alone for names that mean file I/O wherever they come from).
READERS_AND_WRITERS: frozenset[str] = frozenset(
    {
        "torch.save",
        "torch.load",
        "dcp.save",
        "dcp.load",
        "dcp.async_save",
        "dcp.save_state_dict",
        "dcp.load_state_dict",
        "checkpoint.save",
        "checkpoint.load",
        "dist_checkpointing.save",
        "dist_checkpointing.load",
        "pickle.load",
        "pickle.loads",
    }
)
FILE_FUNCTIONS: frozenset[str] = frozenset(
    {
        "save_file",
        "load_file",
        "safe_open",
        "FileSystemReader",
        "FileSystemWriter",
        "save_checkpoint",
        "load_checkpoint",
        "ds_to_universal",
        "get_fp32_state_dict_from_zero_checkpoint",
    }
)


def _dotted(node: ast.expr) -> str:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def offences(source: str) -> list[tuple[int, str]]:
    """``(line, what)`` for each checkpoint reader or writer that ``source`` calls or imports."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            name = _dotted(node.func)
            if ".".join(name.split(".")[-2:]) in READERS_AND_WRITERS or name.split(".")[-1] in FILE_FUNCTIONS:
                found.append((node.lineno, name))
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.name in FILE_FUNCTIONS:
                    found.append((node.lineno, f"from {node.module} import {alias.name}"))
    return found


def test_the_scan_finds_each_kind_of_reader_and_writer() -> None:
    source = (
        "import torch\nimport torch.distributed.checkpoint as dcp\n"
        "from safetensors.torch import save_file\n"
        "def f(engine, state, path):\n"
        "    torch.save(state, path)\n"
        "    dcp.load(state, checkpoint_id=path)\n"
        "    engine.load_checkpoint(path)\n"
        "    torch.distributed.checkpoint.save(state, checkpoint_id=path)\n"
        "    helper.save_weights(state, path)\n"  # a checkpoint-package function: not an offence
    )
    assert [line for line, _ in offences(source)] == [3, 5, 6, 7, 8]


def test_no_module_outside_the_checkpoint_package_reads_or_writes_checkpoint_files() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if CHECKPOINT_PACKAGE in path.parents:
            continue
        for line, what in offences(path.read_text(encoding="utf-8")):
            found.append(f"{path.relative_to(PACKAGE)}:{line}: {what}")
    assert not found, "checkpoint files read or written outside accel_train/checkpoint/:\n" + "\n".join(found)
