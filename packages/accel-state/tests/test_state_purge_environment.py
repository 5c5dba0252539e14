"""``purge_accelerate_environment``: on a function, and on a base test class (its subclasses included)."""

from __future__ import annotations

import os
import unittest

import pytest

from accel_state.environment import purge_accelerate_environment


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [k for k in os.environ if k.startswith("ACCELERATE_")]:
        monkeypatch.delenv(key)


def test_a_function_puts_back_added_and_changed_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_KEPT", "before")

    @purge_accelerate_environment
    def sets() -> str:
        os.environ["ACCELERATE_NEW"] = "1"
        os.environ["ACCELERATE_KEPT"] = "changed"
        os.environ["OTHER_PURGE_CHECK"] = "stays"
        return "done"

    assert sets() == "done"
    assert "ACCELERATE_NEW" not in os.environ and os.environ["ACCELERATE_KEPT"] == "before"
    assert os.environ.pop("OTHER_PURGE_CHECK") == "stays"


def test_a_function_that_raises_is_cleaned_too() -> None:
    @purge_accelerate_environment
    def fails() -> None:
        os.environ["ACCELERATE_RAISED"] = "1"
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        fails()
    assert "ACCELERATE_RAISED" not in os.environ


def _run(case: type[unittest.TestCase], name: str) -> None:
    result = unittest.TestResult()
    case(name).run(result)
    assert result.wasSuccessful(), result.errors + result.failures


def test_a_base_class_cleans_its_own_inherited_and_subclass_tests() -> None:
    class Mixin:
        def test_from_mixin(self) -> None:
            os.environ["ACCELERATE_FROM_MIXIN"] = "1"

    @purge_accelerate_environment
    class Base(Mixin, unittest.TestCase):
        def setUp(self) -> None:
            os.environ["ACCELERATE_FROM_SETUP"] = "1"  # set for the test: still there while it runs

        def test_base(self) -> None:
            assert os.environ["ACCELERATE_FROM_SETUP"] == "1"
            os.environ["ACCELERATE_FROM_BASE"] = "1"

    class Child(Base):
        def test_child(self) -> None:
            os.environ["ACCELERATE_FROM_CHILD"] = "1"

    class GrandChild(Child):
        @staticmethod
        def test_static() -> None:
            os.environ["ACCELERATE_FROM_STATIC"] = "1"

    for case, name, key in [
        (Base, "test_base", "ACCELERATE_FROM_BASE"),
        (Base, "test_from_mixin", "ACCELERATE_FROM_MIXIN"),
        (Child, "test_child", "ACCELERATE_FROM_CHILD"),
        (Child, "test_base", "ACCELERATE_FROM_BASE"),
        (GrandChild, "test_static", "ACCELERATE_FROM_STATIC"),
    ]:
        _run(case, name)
        assert key not in os.environ, (case.__name__, name)
    os.environ.pop("ACCELERATE_FROM_SETUP", None)


def test_a_subclass_keeps_its_base_classes_init_subclass() -> None:
    seen: list[str] = []

    @purge_accelerate_environment
    class Base:
        def __init_subclass__(cls, **kwargs: object) -> None:
            super().__init_subclass__(**kwargs)
            seen.append(cls.__name__)

    class Child(Base):
        def test_sets(self) -> None:
            os.environ["ACCELERATE_CHILD_ONLY"] = "1"

    assert seen == ["Child"]
    Child().test_sets()
    assert "ACCELERATE_CHILD_ONLY" not in os.environ
