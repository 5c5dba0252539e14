"""The distribution installs and exposes its version."""

import importlib.metadata

import accel_train


def test_version_matches_metadata() -> None:
    assert accel_train.__version__ == importlib.metadata.version("accel-train")


def test_every_exported_name_resolves_from_its_module() -> None:
    import importlib

    import accel_train

    for name in accel_train.__all__:
        module = accel_train._EXPORTS.get(name)
        if module is None:
            continue  # __version__
        owner = importlib.import_module(f"accel_train.{module}")
        assert hasattr(owner, name) or name == module, f"accel_train.{name} is listed under {module!r}"
        assert getattr(accel_train, name) is not None
