"""Which FP8 backend to use: torchao, TransformerEngine or MS-AMP (accel-state's ``FP8BackendType``).

The choice, in order: the backend named explicitly (a recipe's ``backend`` or the kind of recipe
given), then ``ACCELERATE_FP8_BACKEND`` (written by ``accel launch`` from ``--fp8_backend`` or the
config file's ``fp8_config.backend``), then what is installed: MS-AMP first (as documented), then
TransformerEngine, then torchao.
"""

from __future__ import annotations

from collections.abc import Mapping

from accel_quant import _requirements
from accel_state import env_vars
from accel_state.enums import FP8BackendType
from accel_state.logging import get_logger

logger = get_logger(__name__)


_ALIASES = {
    "te": FP8BackendType.TE,
    "transformer-engine": FP8BackendType.TE,
    "transformer_engine": FP8BackendType.TE,
    "transformerengine": FP8BackendType.TE,
    "msamp": FP8BackendType.MSAMP,
    "ms-amp": FP8BackendType.MSAMP,
    "ms_amp": FP8BackendType.MSAMP,
    "ao": FP8BackendType.AO,
    "torchao": FP8BackendType.AO,
    "no": FP8BackendType.NO,
}
_REQUIRE = {
    FP8BackendType.TE: _requirements.require_transformer_engine,
    FP8BackendType.MSAMP: _requirements.require_msamp,
    FP8BackendType.AO: _requirements.require_torchao,
}


def parse_fp8_backend(value: str | FP8BackendType | None) -> FP8BackendType:
    """``FP8BackendType`` from a name (``te``, ``msamp``, ``ao``, ``torchao``, ..., any case); None is ``NO``.

    Args:
        value: The name or member to parse.
    """
    if value is None:
        return FP8BackendType.NO
    if isinstance(value, FP8BackendType):
        return value
    found = _ALIASES.get(str(value).strip().lower())
    if found is None:
        raise ValueError(
            f"Unknown FP8 backend {value!r}: use one of 'te' (TransformerEngine), 'msamp' or 'ao' (torchao)."
        )
    return found


def installed_fp8_backends() -> list[FP8BackendType]:
    """The FP8 backends importable here, in the order they are preferred."""
    checks = (
        (FP8BackendType.MSAMP, _requirements.is_msamp_available),
        (FP8BackendType.TE, _requirements.is_transformer_engine_available),
        (FP8BackendType.AO, _requirements.is_torchao_available),
    )
    return [backend for backend, available in checks if available()]


def choose_fp8_backend(
    explicit: str | FP8BackendType | None = None, environ: Mapping[str, str] | None = None
) -> FP8BackendType:
    """The backend to train with (see the module docstring); ImportError naming the package when it is missing.

    Args:
        explicit: A backend asked for by name or `FP8BackendType`; `None` reads `ACCELERATE_FP8_BACKEND`, then
            picks the first installed one.
        environ: The environment to read `ACCELERATE_FP8_*` variables from; `None` reads `os.environ`.
    """
    backend = parse_fp8_backend(explicit)
    source = "requested"
    if backend is FP8BackendType.NO:
        backend = parse_fp8_backend(env_vars.read("ACCELERATE_FP8_BACKEND", environ))
        source = "set by ACCELERATE_FP8_BACKEND"
    if backend is FP8BackendType.NO:
        installed = installed_fp8_backends()
        if not installed:
            raise ImportError(
                "mixed_precision='fp8' needs an FP8 backend and none is installed. torchao runs anywhere "
                f"torch runs: {_requirements.TORCHAO_INSTALL}; TransformerEngine needs a CUDA toolkit: "
                f"{_requirements.TE_INSTALL}; MS-AMP: {_requirements.MSAMP_INSTALL}."
            )
        backend = installed[0]
        logger.info("FP8 training with %s, the first installed backend of %s.", backend, [str(b) for b in installed])
        return backend
    try:
        _REQUIRE[backend]()
    except ImportError as err:
        raise ImportError(f"The FP8 backend {backend} was {source} but is not usable: {err}") from None
    return backend
