"""The model memory estimator: sizes per dtype of a model built on the meta device, and the training estimate.

Training with Adam is estimated as four times the model size in the dtype (weights, gradients and
two optimizer states); inference usually needs up to about 20% more than the model size.
"""

from __future__ import annotations

import importlib
import json
import os
from typing import Any, NamedTuple

from torch import nn

from accel_bigmodel.empty import init_empty_weights
from accel_bigmodel.sizes import calculate_maximum_sizes
from accel_state.install_hints import install_hint

DTYPE_DIVISORS = {"float32": 1, "float16": 2, "bfloat16": 2, "int8": 4, "int4": 8}
ALL_DTYPES = ("float32", "float16", "int8", "int4")


class ModelBuildError(RuntimeError):
    """The model's library found nothing it can build from what was given (an unknown architecture, a
    repository or folder without a model config). A ``RuntimeError``, the type the documented system raises
    for it; the message names the model and the library's own reason."""


class EstimateRow(NamedTuple):
    """Memory figures (bytes) for one dtype; also a sequence ``[dtype, largest_layer, total_size,
    training]``, the row the documented system's ``gather_data`` returns."""

    dtype: str
    largest_layer: int
    total_size: int
    training: int


def estimate_memory(model: nn.Module, dtypes: list[str] | tuple[str, ...] = ALL_DTYPES) -> list[EstimateRow]:
    """Largest layer, total size and Adam training estimate of ``model`` for each dtype (sizes from float32).

    Args:
        model: The model (an `nn.Module`).
        dtypes: The dtypes to estimate for (`float32`, `float16`, `int8`, `int4`, ...).
    """
    unknown = [d for d in dtypes if d not in DTYPE_DIVISORS]
    if unknown:
        raise ValueError(f"Unknown dtypes {unknown}: choose among {list(DTYPE_DIVISORS)}.")
    total, (largest, _) = calculate_maximum_sizes(model)
    # sizes are measured in the model's dtype; express them in float32 first
    to_float32 = float32_factor(model)
    total_fp32, largest_fp32 = int(total * to_float32), int(largest * to_float32)
    rows = []
    for dtype in dtypes:
        divisor = DTYPE_DIVISORS[dtype]
        size = total_fp32 // divisor
        rows.append(EstimateRow(dtype, largest_fp32 // divisor, size, size * 4))
    return rows


def float32_factor(model: nn.Module) -> float:
    """What to multiply ``model``'s byte sizes by to have them in float32: 4 over the element size of its
    first floating-point parameter (1 when it has none), since the estimate's dtypes are divisors of float32.

    Args:
        model: The model (an `nn.Module`).
    """
    for param in model.parameters():
        if param.is_floating_point():
            return 4 / param.element_size()
    return 1.0


def convert_bytes(size: float) -> str:
    """'413.18 MB' style text (powers of 1024, as the documented tables show).

    Args:
        size: Number of bytes.
    """
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if size < 1024 or unit == "TB":
            return f"{round(size, 2)} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def format_table(model_name: str, rows: list[EstimateRow]) -> str:
    """The markdown table printed by ``accel estimate-memory``."""
    header = ["dtype", "Largest Layer", "Total Size", "Training using Adam"]
    cells = [
        [r.dtype, convert_bytes(r.largest_layer), convert_bytes(r.total_size), convert_bytes(r.training)] for r in rows
    ]
    return markdown_table(f"Memory Usage for loading `{model_name}`:", header, cells)


def markdown_table(title: str, header: list[str], cells: list[list[str]]) -> str:
    """``title``, a blank line, and a markdown table of ``header`` over the rows ``cells``, columns padded
    to their widest entry (the layout of the ``accel estimate-memory`` tables).

    Args:
        title: The line above the table.
        header: The column names.
        cells: One list of texts per row, as long as ``header``.
    """
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(header)]
    lines = [title, ""]
    lines.append("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |")
    lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for c in cells:
        lines.append("| " + " | ".join(v.ljust(w) for v, w in zip(c, widths)) + " |")
    return "\n".join(lines)


def _import_like_python_m(module_name: str) -> Any:
    """Import ``module_name`` with the working directory on ``sys.path`` first, as ``python -m`` would
    (the ``accel`` console script does not put it there)."""
    import sys

    here = os.getcwd()
    added = here not in sys.path and "" not in sys.path
    if added:
        sys.path.insert(0, here)
    try:
        return importlib.import_module(module_name)
    finally:
        if added:
            sys.path.remove(here)


def create_empty_model(
    model_name: str, library_name: str | None = None, trust_remote_code: bool = False, access_token: str | None = None
) -> nn.Module:
    """Build ``model_name`` on the meta device.

    ``model_name`` is a Hub id, a local folder or ``config.json`` (transformers), a timm name, or
    ``package.module:factory`` (any importable callable returning a module).

    Args:
        model_name: A Hub id, a local folder or `config.json` (transformers), or a timm model name.
        library_name: `transformers` or `timm`; `None` guesses from the name.
        trust_remote_code: Allow the model's own code from its repository to run (transformers).
        access_token: Token for a gated or private repository.

    Raises:
        OSError: the Hub has no such repository, it is gated, or cannot be reached; a local config file
            named is missing (``FileNotFoundError``).
        ValueError: the name is neither a Hub id nor a local file, the factory cannot be imported, the
            Hub does not say which library the model uses, or the library is not supported.
        ModelBuildError: the library found no model to build (a ``RuntimeError``).
        ImportError: the library (transformers, timm) or huggingface_hub is not installed.
    """
    if ":" in model_name and not os.path.exists(model_name) and library_name in (None, "torch"):
        module_name, _, attr = model_name.partition(":")
        try:
            factory = getattr(_import_like_python_m(module_name), attr)
        except (ImportError, AttributeError) as err:
            raise ValueError(f"Cannot import the model factory {model_name!r}: {err}.") from None
        with init_empty_weights():
            return factory()
    if _names_a_local_path(model_name) and not os.path.exists(model_name):
        raise FileNotFoundError(
            f"{model_name!r} does not exist: pass an existing config.json or a folder holding one, a Hub id "
            "or a timm model name."
        )
    if library_name is None:
        library_name = _guess_library(model_name, access_token)
    if library_name == "transformers":
        return _transformers_model(model_name, trust_remote_code, access_token)
    if library_name == "timm":
        return _timm_model(model_name)
    raise ValueError(f"library_name {library_name!r} is not supported: use 'transformers' or 'timm'.")


def _names_a_local_path(model_name: str) -> bool:
    """Whether ``model_name`` can only be a path: a ``.json`` file, or a name no Hub id or timm name takes
    (absolute, or starting with ``.`` or ``~``)."""
    return model_name.endswith(".json") or os.path.isabs(model_name) or model_name.startswith((".", "~"))


def _guess_library(model_name: str, access_token: str | None) -> str:
    if os.path.isdir(model_name) or model_name.endswith(".json"):
        config_path = os.path.join(model_name, "config.json") if os.path.isdir(model_name) else model_name
        if not os.path.isfile(config_path):
            where = f"{config_path!r} does not exist"
            if os.path.isdir(model_name):
                where = f"{model_name!r} has no config.json ({where})"
            raise FileNotFoundError(f"{where}: pass a transformers config.json, a folder holding one, or a Hub id.")
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
        return "timm" if "architecture" in config and "model_type" not in config else "transformers"
    from accel_state.imports import is_huggingface_hub_available

    if not is_huggingface_hub_available():
        raise ImportError(
            f"Finding {model_name!r} on the Hub needs huggingface_hub (or pass a local config file): "
            f"{install_hint('accel-bigmodel', 'hub')}."
        )
    info = _hub_model_info(model_name, access_token)
    library = getattr(info, "library_name", None)
    if library not in ("transformers", "timm"):
        raise ValueError(
            f"{model_name!r} does not say which library it uses ({library!r}): pass --library_name transformers or timm."
        )
    return library


def _hub_model_info(model_name: str, access_token: str | None) -> Any:
    """The Hub's information on ``model_name``, its failures in the documented system's types: ``OSError``
    for a repository that does not exist, is gated or cannot be reached, ``ValueError`` for a name that
    cannot be a Hub id."""
    from huggingface_hub import model_info
    from huggingface_hub.utils import GatedRepoError, RepositoryNotFoundError

    try:
        return model_info(model_name, token=access_token)
    except GatedRepoError:  # a subclass of RepositoryNotFoundError: first
        raise OSError(
            f"{model_name!r} is gated on the Hub: log in (`hf auth login`) with an account that was granted access."
        ) from None
    except RepositoryNotFoundError:
        raise OSError(
            f"{model_name!r} is not a model on the Hub (or a private one this account cannot see): check the id, "
            "or log in (`hf auth login`)."
        ) from None
    except OSError as err:  # offline, no connection, a server error
        raise OSError(
            f"Cannot look {model_name!r} up on the Hub ({type(err).__name__}: {err}): check the connection, or "
            "pass a local config.json or a folder holding one."
        ) from None
    except ValueError as err:  # not the form of a Hub id
        raise ValueError(
            f"{model_name!r} is neither a Hub model id nor a local config.json or folder ({err})."
        ) from None


#: What transformers says when a repository or folder holds no model config it knows.
_NO_TRANSFORMERS_MODEL = ("does not appear to have a file named", "Unrecognized model in")


def _transformers_model(model_name: str, trust_remote_code: bool, access_token: str | None) -> nn.Module:
    from accel_state.imports import is_transformers_available

    if not is_transformers_available():
        raise ImportError(
            f"Building {model_name!r} needs transformers: {install_hint('accel-bigmodel', 'transformers')}."
        )
    import transformers

    source = os.path.dirname(model_name) if model_name.endswith(".json") else model_name
    try:
        config = transformers.AutoConfig.from_pretrained(
            source, trust_remote_code=trust_remote_code, token=access_token
        )
    except (OSError, ValueError) as err:
        if not any(phrase in str(err) for phrase in _NO_TRANSFORMERS_MODEL):
            raise
        raise ModelBuildError(f"transformers found no model to build in {model_name!r}: {err}") from err
    auto = transformers.AutoModel
    for arch in getattr(config, "architectures", None) or []:
        candidate = getattr(transformers, arch, None)
        if candidate is not None:
            auto = candidate
            break
    with init_empty_weights():
        if auto is transformers.AutoModel:
            return auto.from_config(config, trust_remote_code=trust_remote_code)
        return auto(config)  # type: ignore[return-value]


def _timm_model(model_name: str) -> nn.Module:
    from accel_state.imports import is_timm_available

    if not is_timm_available():
        raise ImportError(f"Building {model_name!r} needs timm: {install_hint('accel-bigmodel', 'timm')}.")
    import timm

    try:
        with init_empty_weights():
            return timm.create_model(model_name, pretrained=False)
    except RuntimeError as err:
        if "Unknown model" not in str(err):
            raise
        raise ModelBuildError(f"timm has no model named {model_name!r}: {err}") from err


def verify_on_hub(repo: str, token: str | None = None) -> Any:
    """The Hub's model information for ``repo``; ``"gated"`` when it is gated (or cannot be reached),
    ``"repo"`` when there is no such repository.

    Raises:
        ImportError: huggingface_hub is not installed.
    """
    from accel_state.imports import is_huggingface_hub_available

    if not is_huggingface_hub_available():
        raise ImportError(
            f"Looking a model up on the Hub needs huggingface_hub: {install_hint('accel-bigmodel', 'hub')}."
        )
    from huggingface_hub import model_info
    from huggingface_hub.utils import GatedRepoError, RepositoryNotFoundError

    try:
        return model_info(repo, token=token)
    except GatedRepoError:  # a subclass of RepositoryNotFoundError: first
        return "gated"
    except RepositoryNotFoundError:  # an OSError too: before the generic case
        return "repo"
    except OSError:
        return "gated"


def gather_data(args: Any) -> list[Any]:
    """Rows for the parsed CLI arguments: `EstimateRow`s, or `ExpertParallelRow`s when ``args.ep_size``
    (absent means 1) is above 1.

    Raises:
        ValueError: ``args.ep_size`` is not an int >= 1, or does not fit the model (see
            `estimate_expert_parallel_memory()`); and the errors of `create_empty_model()`.
    """
    from accel_bigmodel.expert_estimate import check_ep_size, estimate_expert_parallel_memory

    ep_size = getattr(args, "ep_size", 1)
    check_ep_size(ep_size)  # before building the model: bad input fails fast
    model = create_empty_model(
        args.model_name, library_name=args.library_name, trust_remote_code=args.trust_remote_code
    )
    if ep_size == 1:
        return estimate_memory(model, args.dtypes)
    return estimate_expert_parallel_memory(model, ep_size, args.dtypes, model_name=args.model_name)
