"""An example script that names a nox session names one that runs it (issue 37).

Examples run in CI through the integration tests (``integration_tests/test_*.py`` start them as a user
would), so a session runs an example when its code, through the helpers it calls, runs
``integration_tests`` and one of those tests starts the example.
"""

from __future__ import annotations

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
NAMED_SESSION = re.compile(r"nox -s ([A-Za-z0-9_-]+)")


def _is_session(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return isinstance(target, ast.Attribute) and target.attr == "session"


def session_sources() -> dict[str, str]:
    """Session name -> its function's source with that of every noxfile function it calls, transitively."""
    text = (ROOT / "noxfile.py").read_text(encoding="utf-8")
    functions = {node.name: node for node in ast.parse(text).body if isinstance(node, ast.FunctionDef)}

    def closure(name: str, seen: set[str]) -> str:
        seen.add(name)
        node = functions[name]
        parts = [ast.get_source_segment(text, node) or ""]
        for call in ast.walk(node):
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Name):
                callee = call.func.id
                if callee in functions and callee not in seen:
                    parts.append(closure(callee, seen))
        return "\n".join(parts)

    return {
        name: closure(name, set())
        for name, node in functions.items()
        if any(_is_session(decorator) for decorator in node.decorator_list)
    }


def runs_example(source: str, example: pathlib.Path) -> bool:
    """Whether a session of that source runs ``example`` through an integration test."""
    if '"integration_tests"' not in source:
        return False
    return any(
        example.name in test.read_text(encoding="utf-8") for test in (ROOT / "integration_tests").glob("test_*.py")
    )


def test_the_rule_tells_a_session_that_runs_an_example_from_one_that_does_not() -> None:
    sessions = session_sources()
    demo = ROOT / "examples" / "collectives_demo.py"
    assert runs_example(sessions["integration"], demo)
    assert not runs_example(sessions["docs"], demo)  # the guide's examples, not the integration tests
    assert not runs_example(sessions["demo"], demo)  # demo runs train_demo.py


def test_every_session_an_example_names_runs_it() -> None:
    sessions = session_sources()
    wrong = []
    for example in sorted((ROOT / "examples").rglob("*.py")):
        for name in NAMED_SESSION.findall(example.read_text(encoding="utf-8")):
            if name not in sessions or not runs_example(sessions[name], example):
                wrong.append(f"{example.relative_to(ROOT)} names `nox -s {name}`, which does not run it")
    assert wrong == []
