"""The meta-package's tables of a package that declares its own lists are generated from them, up to date,
and hold exactly the union of that package's lists (one source of truth)."""

from __future__ import annotations

import importlib

import pytest

from accel import _exports
from accel._exports import generate


@pytest.mark.parametrize("table", sorted(generate.GENERATED))
def test_generated_table_is_up_to_date(table: str) -> None:
    on_disk = generate.path_of(table).read_text(encoding="utf-8")
    assert on_disk == generate.render(table), f"run `python -m accel._exports.generate` ({table}.py is stale)"


@pytest.mark.parametrize("table", sorted(generate.GENERATED))
def test_meta_package_exports_exactly_the_packages_lists(table: str) -> None:
    package = generate.GENERATED[table]
    declared = importlib.import_module(package).meta_exports()
    for key in ("TOP_LEVEL", "UTILS", "MODULES"):
        merged = getattr(_exports, key)
        owned = {name: target for name, target in merged.items() if target.split(".")[0] == package}
        assert owned == declared[key], key


def test_every_accel_train_name_resolves_through_the_meta_package() -> None:
    import accel
    import accel.utils

    declared = importlib.import_module("accel_train").meta_exports()
    for name in declared["TOP_LEVEL"]:
        assert getattr(accel, name) is getattr(importlib.import_module(declared["TOP_LEVEL"][name]), name)
    for name in declared["UTILS"]:
        assert getattr(accel.utils, name) is getattr(importlib.import_module(declared["UTILS"][name]), name)
