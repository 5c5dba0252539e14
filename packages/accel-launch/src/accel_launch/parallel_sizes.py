"""The ``ParallelismConfig`` sizes a launch hands to its processes: each checked, and their product.

A size (``--parallelism_config_dp_replicate_size`` ... ``--parallelism_config_ep_size``) is the
length of one dimension of the processes' device mesh, so it is a whole number of at least 1; the
launcher refuses anything else by name before starting a process. The sizes multiply to the number
of processes the mesh spans (world = dp_replicate x dp_shard x ep x tp x cp x sp x pp). A script may
still set its own sizes in ``ParallelismConfig(...)``, which win over the launcher's, so a product
that differs from the process count is a warning here; the Accelerator refuses it in the processes
when the script does not change it. No torch import here.
"""

from __future__ import annotations

from accel_launch.values import ConfigError

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time: `accel --help` stays fast
    from collections.abc import Mapping
    from typing import Any

#: The size options, in the order of the product a message shows (a test keeps it equal to the
#: ``*_size`` options of the table).
SIZE_OPTIONS: tuple[str, ...] = tuple(
    f"parallelism_config_{name}_size" for name in ("dp_replicate", "dp_shard", "ep", "tp", "cp", "sp", "pp")
)

#: Launch modes whose processes form one process group (the mesh spans all of them).
_ONE_GROUP_MODES = ("simple", "torchrun", "deepspeed", "mpirun")


def _named(name: str, sources: Mapping[str, str]) -> str:
    source = sources.get(name, "default")
    return f"--{name}" if source.startswith("flag") else f"{name} ({source})"


def check_sizes(values: Mapping[str, Any], sources: Mapping[str, str]) -> None:
    """Refuse a parallelism size below 1, naming the setting, where it came from and what is allowed.

    Whole numbers are already enforced where values are read (the flag parser, the config file), so
    only the range is left; a size the run ignores (no ``--use_parallelism_config``) is checked too,
    since it is wrong wherever it is used.

    Args:
        values: the resolved launch options (flag over config file over default).
        sources: where each value came from (``flag --x``, ``config file <path>``, ``default``, ...).

    Raises:
        ConfigError: a size that is below 1.
    """
    for name in SIZE_OPTIONS:
        value = values.get(name)
        if value is not None and value < 1:
            raise ConfigError(
                f"{_named(name, sources)} must be a whole number of at least 1 (1 leaves that dimension "
                f"unsplit), got {value}"
            )


def size_product(values: Mapping[str, Any]) -> tuple[int, str]:
    """The product of the parallelism sizes and its terms as a message shows them (``dp_shard 2 x ep 2``).

    Sizes of 1 are left out of the terms (all of them when every size is 1).
    """
    product = 1
    terms = []
    for name in SIZE_OPTIONS:
        size = values.get(name) or 1
        product *= size
        if size != 1:
            terms.append(f"{name.removeprefix('parallelism_config_').removesuffix('_size')} {size}")
    return product, " x ".join(terms) or "every size 1"


def product_warning(values: Mapping[str, Any], num_processes: int, mode: str) -> str | None:
    """The warning for parallelism sizes that do not multiply to the process count, or None.

    Only with ``use_parallelism_config`` on and in a mode whose processes form one group (independent
    copies and TPU or SageMaker jobs count their processes elsewhere).

    Args:
        values: the resolved launch options.
        num_processes: the processes of the run, all machines together.
        mode: the launch mode of the plan (``torchrun``, ``copies``, ...).

    Returns:
        One line naming the product, its terms and the process count, or None when they agree.
    """
    if not values.get("use_parallelism_config") or mode not in _ONE_GROUP_MODES:
        return None
    product, terms = size_product(values)
    if product == num_processes:
        return None
    return (
        f"the parallelism sizes multiply to {product} ({terms}) but the run has {num_processes} "
        f"process{'es' if num_processes != 1 else ''}: the Accelerator refuses this unless the script's "
        "ParallelismConfig(...) sets sizes that multiply to the process count"
    )
