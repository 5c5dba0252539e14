"""Process-wide shared state: where this process runs and what the run is.

``PartialState``, ``AcceleratorState`` and ``GradientState`` are borg classes: every instance shares
one ``__dict__``, filled on the first instantiation. ``PartialState`` reads the launcher's variables,
picks the device and starts the process group; ``AcceleratorState`` adds mixed precision and the
parallelism plugins; ``GradientState`` tracks gradient accumulation and the active data loader.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import os
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, TypeVar

from accel_state import cluster, devices, env_vars
from accel_state.enums import DistributedType, PrecisionType

logger = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Any])


def _torch() -> Any:
    import torch

    return torch


def is_initialized() -> bool:
    """True once a `PartialState` has been set up in this process."""
    return PartialState._shared_state.get("_initialized", False)


class PartialState:
    """Device, ranks and process group of this process, shared by every instance.

    Args:
        cpu: run on CPU even when an accelerator is present.
        **kwargs: ``backend``, ``timeout`` (a ``timedelta``) and ``init_method`` for the process group.
    """

    _shared_state: dict[str, Any] = {}
    _known_attrs = (
        "_cpu",
        "_mixed_precision",
        "_shared_state",
        "backend",
        "debug",
        "device",
        "distributed_type",
        "fork_launched",
        "local_process_index",
        "num_processes",
        "process_index",
    )

    def __init__(self, cpu: bool = False, **kwargs: Any) -> None:
        self.__dict__ = self._shared_state
        if self._shared_state.get("_initialized"):
            if cpu and self.device.type != "cpu":
                raise RuntimeError(
                    "PartialState was already initialised on "
                    f"{self.device}; cpu=True cannot change it. Create it with cpu=True first."
                )
            return
        self._setup(cpu=cpu or env_vars.read("ACCELERATE_USE_CPU"), **kwargs)

    # -- set-up -----------------------------------------------------------------------------------

    def _setup(
        self,
        cpu: bool,
        backend: str | None = None,
        timeout: timedelta | None = None,
        init_method: str | None = None,
        **_ignored: Any,
    ) -> None:
        torch = _torch()
        import torch.distributed as dist

        self._cpu = cpu
        self.debug = env_vars.read("ACCELERATE_DEBUG_MODE")
        self.fork_launched = False
        device_type = devices.detect_device_type(cpu=cpu)
        proc = cluster.detect(os.environ)
        self._owns_process_group = False

        if device_type == "xla":
            self._setup_xla(timeout)
            return
        if dist.is_available() and dist.is_initialized():
            # The user (or another library) already started the group: adopt it.
            self.num_processes = dist.get_world_size()
            self.process_index = dist.get_rank()
            self.local_process_index = proc.local_rank if proc.is_distributed else self.process_index
            self.backend: str | None = str(dist.get_backend())
        elif proc.is_distributed:
            if backend == "nccl" and device_type == "cpu":
                backend = None  # the InitProcessGroupKwargs default does not apply to a CPU run
            self.backend = devices.backend_for(device_type, backend)
            for key, value in proc.torch_variables().items():
                os.environ.setdefault(key, value)
            if device_type != "cpu" and devices.device_count(device_type) > 0:
                index = devices.pick_device_index(
                    device_type, proc.local_rank, devices.device_count(device_type), devices.forced_device_index(cpu)
                )
                getattr(torch, device_type).set_device(index)
            if device_type == "cuda" and env_vars.read("ACCELERATE_CPU_AFFINITY"):
                from accel_state.environment import set_numa_affinity

                set_numa_affinity(proc.local_rank)  # the CPUs near this GPU (launch --enable_cpu_affinity)
            init_kwargs: dict[str, Any] = {"backend": self.backend}
            if timeout is not None:
                init_kwargs["timeout"] = timeout
            if init_method is not None:
                init_kwargs["init_method"] = init_method
                init_kwargs["rank"] = proc.rank
                init_kwargs["world_size"] = proc.world_size
            dist.init_process_group(**init_kwargs)
            self._owns_process_group = True
            _STARTED["default_group"] = True
            self.num_processes = dist.get_world_size()
            self.process_index = dist.get_rank()
            self.local_process_index = proc.local_rank
        else:
            self.backend = None
            self.num_processes = 1
            self.process_index = 0
            self.local_process_index = 0

        self.local_num_processes = proc.local_world_size if self.num_processes > 1 else 1
        if self.num_processes > 1:
            self.distributed_type = devices.MULTI_TYPE_BY_DEVICE.get(device_type, DistributedType.MULTI_CPU)
        else:
            self.distributed_type = DistributedType.NO
        self.device = self._pick_device(device_type, devices.forced_device_index(cpu))
        self._initialized = True
        if self._owns_process_group:
            atexit.register(_destroy_at_exit)

    def _setup_xla(self, timeout: timedelta | None) -> None:
        """Run on torch_xla's device, with the replica count and ordinals of its runtime.

        The distributed type is ``XLA`` whatever the number of replicas (one replica included), as
        documented. With several replicas, ``torch.distributed`` is started on torch_xla's ``xla``
        backend (unless someone already started it) so that collectives and barriers reach every replica.
        """
        import torch.distributed as dist

        from accel_state.xla_runtime import read_xla_process

        xla = read_xla_process()
        self.device = xla.device
        self.num_processes = xla.world_size
        self.process_index = xla.process_index
        self.local_process_index = xla.local_process_index
        self.local_num_processes = xla.local_world_size
        self.backend = "xla" if xla.world_size > 1 else None
        if xla.world_size > 1 and dist.is_available() and not dist.is_initialized():
            import torch_xla.distributed.xla_backend  # type: ignore[import-not-found]  # noqa: F401  (registers "xla")

            init_kwargs: dict[str, Any] = {"backend": "xla", "init_method": "xla://"}
            if timeout is not None:
                init_kwargs["timeout"] = timeout
            dist.init_process_group(**init_kwargs)
            self._owns_process_group = True
            _STARTED["default_group"] = True
            atexit.register(_destroy_at_exit)
        self.distributed_type = DistributedType.XLA
        self._initialized = True

    def _pick_device(self, device_type: str, forced_index: int | None = None) -> Any:
        count = devices.device_count(device_type)
        index = devices.pick_device_index(device_type, self.local_process_index, count, forced_index)
        return _torch().device(device_type, index)

    # -- identity ---------------------------------------------------------------------------------

    def __repr__(self) -> str:
        return (
            f"Distributed environment: {self.distributed_type}{('  Backend: ' + self.backend) if self.backend else ''}\n"
            f"Num processes: {self.num_processes}\n"
            f"Process index: {self.process_index}\n"
            f"Local process index: {self.local_process_index}\n"
            f"Device: {self.device}\n"
        )

    @property
    def initialized(self) -> bool:
        """True once the shared state has been set up."""
        return self._shared_state.get("_initialized", False)

    @property
    def use_distributed(self) -> bool:
        """True when more than one process takes part."""
        return self.distributed_type != DistributedType.NO and self.num_processes > 1

    @property
    def is_main_process(self) -> bool:
        """True on the process of global rank 0."""
        return self.process_index == 0

    @property
    def is_local_main_process(self) -> bool:
        """True on the first process of each machine."""
        return self.local_process_index == 0

    @property
    def is_last_process(self) -> bool:
        """True on the process of the highest global rank."""
        return self.process_index == self.num_processes - 1

    @property
    def default_device(self) -> Any:
        """The device this process would use if nothing was forced."""
        return self._pick_device(devices.detect_device_type(), devices.forced_device_index())

    @property
    def is_fsdp2(self) -> bool:
        """True when this run uses FSDP2 (read from the launcher's environment)."""
        return self.distributed_type == DistributedType.FSDP and os.environ.get("FSDP_VERSION", "1") == "2"

    # -- process control --------------------------------------------------------------------------

    def wait_for_everyone(self) -> None:
        """Block until every process reaches this point (no-op in a single process; torch_xla's
        rendezvous on XLA)."""
        if self.num_processes > 1:
            if self.distributed_type == DistributedType.XLA:
                from accel_state.xla_runtime import xla_rendezvous

                xla_rendezvous("accel.wait_for_everyone")
                return
            _barrier()

    @contextlib.contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Iterator[Any]:
        """Give each process its contiguous share of ``inputs`` (list, tuple, tensor or dict of them).

        With ``apply_padding`` every share has the same length, the last element repeated, so that
        the results can be gathered; drop the extra results afterwards.

        Args:
            inputs: What to split: a list, tuple, dict of lists / tensors, or a tensor (split along its first
                dimension).
            apply_padding: Repeat the last item so every process gets the same number of items (useful before
                `gather`).
        """
        from accel_state.splitting import split_for_process

        yield split_for_process(inputs, self.num_processes, self.process_index, apply_padding)

    def _goes_first(self, is_first: bool) -> Iterator[None]:
        if not is_first:
            self.wait_for_everyone()
        yield
        if is_first:
            self.wait_for_everyone()

    @contextlib.contextmanager
    def main_process_first(self) -> Iterator[None]:
        """Run the block on the main process first, then on the others."""
        yield from self._goes_first(self.is_main_process)

    @contextlib.contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        """Run the block on each machine's local main process first, then on the others."""
        yield from self._goes_first(self.is_local_main_process)

    def _only_if(self, condition: Callable[[], bool], function: F) -> F:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if condition():
                return function(*args, **kwargs)
            return None

        return wrapper  # type: ignore[return-value]

    def on_main_process(self, function: F) -> F:
        """Decorator: run ``function`` on the main process only.

        Args:
            function: The function to wrap.
        """
        return self._only_if(lambda: self.is_main_process, function)

    def on_local_main_process(self, function: F) -> F:
        """Decorator: run ``function`` on the local main process of each machine only.

        Args:
            function: The function to wrap.
        """
        return self._only_if(lambda: self.is_local_main_process, function)

    def on_last_process(self, function: F) -> F:
        """Decorator: run ``function`` on the last process only.

        Args:
            function: The function to wrap.
        """
        return self._only_if(lambda: self.is_last_process, function)

    def on_process(self, function: F | None = None, process_index: int | None = None) -> Any:
        """Decorator: run ``function`` on the process of global index ``process_index`` only.

        Args:
            function: The function to wrap.
            process_index: Global index of the process that runs the function.
        """
        if function is None:
            return functools.partial(self.on_process, process_index=process_index)
        return self._only_if(lambda: self.process_index == process_index, function)

    def on_local_process(self, function: F | None = None, local_process_index: int | None = None) -> Any:
        """Decorator: run ``function`` on the process of local index ``local_process_index`` only.

        Args:
            function: The function to wrap.
            local_process_index: Index, on its machine, of the process that runs the function.
        """
        if function is None:
            return functools.partial(self.on_local_process, local_process_index=local_process_index)
        return self._only_if(lambda: self.local_process_index == local_process_index, function)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` once per machine (on the local main process).

        Args:
            *args: What to print, as for `print`.
            **kwargs: Keyword arguments of `print`.
        """
        if self.is_local_main_process:
            print(*args, **kwargs)

    def set_device(self) -> None:
        """Make this process's device the current one of its type."""
        if self.device.type not in ("cpu", "mps", "xla") and self.device.index is not None:
            getattr(_torch(), self.device.type).set_device(self.device)

    @staticmethod
    def destroy_process_group(group: Any = None) -> None:
        """Tear down the process group this state started (or ``group``); nothing when there is none.

        The state is shared by every instance, so this needs none: it may be called on the class
        (``PartialState.destroy_process_group()``) and after ``_reset_state()``.

        Args:
            group: The process group to destroy; `None` destroys the default group, when accel started it.
        """
        _destroy_process_group(group)

    @staticmethod
    def _reset_state() -> None:
        """Forget the shared state (tests and notebooks); the process group is left as it is."""
        PartialState._shared_state.clear()

    def __getattr__(self, name: str) -> Any:
        if name in self._known_attrs:
            raise AttributeError(
                f"`PartialState` object has no attribute `{name}`: the state is not initialised yet. "
                "Create `PartialState()` (or an `Accelerator`) first. This happens if `PartialState._reset_state()` "
                "was called and an `Accelerator` or `PartialState` was not reinitialized."
            )
        raise AttributeError(f"'PartialState' object has no attribute '{name}'")


#: Whether accel started this process's default group (survives ``_reset_state``; a group started by
#: the user or another library, Ray Train's say, is theirs to destroy).
_STARTED = {"default_group": False}


def _destroy_process_group(group: Any = None) -> None:
    """``group``, or the default group when accel started it; a no-op without torch.distributed or a group.

    Reads only module and class state, never an instance's: it works after a state reset, where
    instances have forgotten everything.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    if group is not None:
        dist.destroy_process_group(group)
    elif PartialState._shared_state.get("_owns_process_group") or _STARTED["default_group"]:
        # A state reset forgets the shared state, not that this process started the group.
        dist.destroy_process_group()
        if "_owns_process_group" in PartialState._shared_state:
            PartialState._shared_state["_owns_process_group"] = False
        _STARTED["default_group"] = False


def _destroy_at_exit() -> None:
    """Free process groups while the interpreter is still whole.

    Objects that hold a gloo group (a DDP model inside a reference cycle, say) would otherwise be
    destroyed during interpreter finalisation, where gloo's worker threads can abort the process.
    """
    import gc

    gc.collect()
    with contextlib.suppress(Exception):
        _destroy_process_group()  # no PartialState(): at exit, building one could start a group


_PLUGIN_TYPES = {
    "deepspeed_plugin": DistributedType.DEEPSPEED,
    "fsdp_plugin": DistributedType.FSDP,
    "megatron_lm_plugin": DistributedType.MEGATRON_LM,
}


class AcceleratorState:
    """Everything `PartialState` knows, plus mixed precision and the parallelism plugins.

    Attributes not defined here (``device``, ``num_processes``, ...) come from `PartialState`.

    Args:
        mixed_precision: `no`, `fp16`, `bf16` or `fp8`; `None` reads `ACCELERATE_MIXED_PRECISION` (default
            `no`).
        cpu: Run on CPU even when an accelerator is present.
        dynamo_plugin: The `torch.compile` settings (`TorchDynamoPlugin`), or `None` to read them from the
            environment.
        deepspeed_plugin: A `DeepSpeedPlugin`, or a dict of named ones, when DeepSpeed is used.
        fsdp_plugin: A `FullyShardedDataParallelPlugin` when FSDP is used.
        torch_tp_plugin: A `TorchTensorParallelPlugin` when tensor parallelism is used.
        megatron_lm_plugin: A `MegatronLMPlugin` when Megatron-LM is used.
        parallelism_config: A `ParallelismConfig` describing an ND device mesh (data, tensor, context parallel
            sizes).
        **kwargs: Passed on to `PartialState` (for example `cpu`, `backend`, `timeout`).
    """

    _shared_state: dict[str, Any] = {}
    _known_attrs = (
        "_mixed_precision",
        "deepspeed_plugins",
        "dynamo_plugin",
        "fsdp_plugin",
        "megatron_lm_plugin",
        "parallelism_config",
        "torch_tp_plugin",
        "use_ipex",
    )

    def __init__(
        self,
        mixed_precision: str | None = None,
        cpu: bool = False,
        dynamo_plugin: Any = None,
        deepspeed_plugin: Any = None,
        fsdp_plugin: Any = None,
        torch_tp_plugin: Any = None,
        megatron_lm_plugin: Any = None,
        parallelism_config: Any = None,
        _from_accelerator: bool = False,
        **kwargs: Any,
    ) -> None:
        self.__dict__ = self._shared_state
        if self._shared_state.get("_initialized") and not PartialState._shared_state.get("_initialized"):
            # PartialState._reset_state() was called (test suites, notebooks): this state is stale.
            if _from_accelerator:
                # A new Accelerator gives its whole configuration: build the state again from it.
                self._shared_state.clear()
            else:
                self._reattach_partial_state(cpu, **kwargs)
        if self._shared_state.get("_initialized"):
            if mixed_precision is not None and str(mixed_precision) != self._mixed_precision:
                raise ValueError(
                    "AcceleratorState has already been initialized and cannot be changed: it was initialised with "
                    f"mixed_precision={self._mixed_precision!r}, not {mixed_precision!r}. Restart the process (or call "
                    "AcceleratorState._reset_state(True)) and pass mixed_precision to the first Accelerator()."
                )
            return
        if parse_use_cpu := env_vars.read("ACCELERATE_USE_CPU"):
            cpu = parse_use_cpu
        self._partial = PartialState(cpu, **kwargs)
        precision = mixed_precision if mixed_precision is not None else env_vars.read("ACCELERATE_MIXED_PRECISION")
        self._mixed_precision: str = PrecisionType.parse(precision).value
        self.dynamo_plugin = dynamo_plugin
        self.torch_tp_plugin = torch_tp_plugin
        self.parallelism_config = parallelism_config
        self.megatron_lm_plugin = megatron_lm_plugin
        self.fsdp_plugin = fsdp_plugin
        self.deepspeed_plugins: Any = None
        self.distributed_type = self._partial.distributed_type
        if deepspeed_plugin is not None:
            if isinstance(deepspeed_plugin, dict):
                self.deepspeed_plugins = deepspeed_plugin
                first = next(iter(deepspeed_plugin.values()))
                if hasattr(first, "select"):
                    first.select(_from_accelerator_state=True)
            else:
                self.deepspeed_plugins = {"default": deepspeed_plugin}
            self.distributed_type = DistributedType.DEEPSPEED
        elif fsdp_plugin is not None:
            self.distributed_type = DistributedType.FSDP
        elif megatron_lm_plugin is not None:
            self.distributed_type = DistributedType.MEGATRON_LM
        self.use_ipex = False
        self._initialized = True

    def _reattach_partial_state(self, cpu: bool, **kwargs: Any) -> None:
        """Set up a new PartialState under this state, keeping precision and plugins."""
        if env_vars.read("ACCELERATE_USE_CPU"):
            cpu = True
        self._partial = PartialState(cpu, **kwargs)
        if self.distributed_type not in _PLUGIN_TYPES.values():
            self.distributed_type = self._partial.distributed_type

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_partial", "_shared_state"):
            raise AttributeError(name)
        partial = self._shared_state.get("_partial")
        if partial is None or not partial._shared_state.get("_initialized"):
            if name in PartialState._known_attrs or name in self._known_attrs:
                raise AttributeError(
                    f"`AcceleratorState` object has no attribute `{name}`: the state is not initialised yet. "
                    "Create an `Accelerator()` (or `AcceleratorState()`) first. This happens if "
                    "`AcceleratorState._reset_state()` was called and an `Accelerator` or `PartialState` was not "
                    "reinitialized."
                )
            raise AttributeError(f"'AcceleratorState' object has no attribute '{name}'")
        try:
            return getattr(partial, name)
        except AttributeError:
            raise AttributeError(f"'AcceleratorState' object has no attribute '{name}'") from None

    def __repr__(self) -> str:
        text = repr(self._partial).replace(str(self._partial.distributed_type), str(self.distributed_type), 1)
        return text + f"\nMixed precision type: {self.mixed_precision}\n"

    @property
    def initialized(self) -> bool:
        """True once the shared state has been set up in this process."""
        return self._shared_state.get("_initialized", False)

    @property
    def mixed_precision(self) -> str:
        """``no``, ``fp16``, ``bf16`` or ``fp8`` (DeepSpeed configs may set their own)."""
        return self._mixed_precision

    @property
    def use_distributed(self) -> bool:
        """True when the run has more than one process."""
        return self._partial.use_distributed

    @property
    def is_fsdp2(self) -> bool:
        """True when the FSDP plugin of this run uses FSDP2 (`fully_shard`)."""
        plugin = self.fsdp_plugin
        return self.distributed_type == DistributedType.FSDP and getattr(plugin, "fsdp_version", 1) == 2

    @property
    def deepspeed_plugin(self) -> Any:
        """The active DeepSpeed plugin (the one selected when several are given)."""
        plugins = self.deepspeed_plugins
        if not plugins:
            return None
        for plugin in plugins.values():
            if getattr(plugin, "selected", False):
                return plugin
        return next(iter(plugins.values()))

    def get_deepspeed_plugin(self, name: str) -> Any:
        """The DeepSpeed plugin registered under ``name``.

        Args:
            name: Name of the plugin, as a key of the `deepspeed_plugins` dict given to the `Accelerator`.
        """
        if not self.deepspeed_plugins or name not in self.deepspeed_plugins:
            known = list(self.deepspeed_plugins or {})
            raise KeyError(f"no DeepSpeed plugin named {name!r}; known plugins: {known}")
        return self.deepspeed_plugins[name]

    def select_deepspeed_plugin(self, name: str | None = None) -> None:
        """Make the DeepSpeed plugin ``name`` the active one.

        Args:
            name: Name of the plugin, as a key of the `deepspeed_plugins` dict given to the `Accelerator`.
        """
        for key, plugin in (self.deepspeed_plugins or {}).items():
            if key != name and hasattr(plugin, "_unselect"):
                plugin._unselect()
        chosen = self.get_deepspeed_plugin(name) if name is not None else self.deepspeed_plugin
        if hasattr(chosen, "select"):
            chosen.select(_from_accelerator_state=True)

    @staticmethod
    def _reset_state(reset_partial_state: bool = False) -> None:
        """Forget the shared state (and the PartialState with ``reset_partial_state``)."""
        AcceleratorState._shared_state.clear()
        if reset_partial_state:
            PartialState._reset_state()

    @staticmethod
    def destroy_process_group(group: Any = None) -> None:
        """Tear down the process group accel started (or ``group``); nothing when there is none.

        Callable on the class (``AcceleratorState.destroy_process_group()``) and after
        ``_reset_state()``, as on an instance: the process group belongs to the process, not to a state.

        Args:
            group: The process group to destroy; `None` destroys the default group, when accel started it.
        """
        _destroy_process_group(group)

    # Process-control helpers are those of PartialState.
    def wait_for_everyone(self) -> None:
        """Block until every process reaches this point (a no-op on one process)."""
        self._partial.wait_for_everyone()

    def print(self, *args: Any, **kwargs: Any) -> None:
        """Print on the main process only.

        Args:
            *args: What to print, as for `print`.
            **kwargs: Keyword arguments of `print`.
        """
        self._partial.print(*args, **kwargs)


class GradientState:
    """Gradient accumulation bookkeeping shared by the Accelerator, its optimizers and data loaders.

    Args:
        gradient_accumulation_plugin: any object with ``num_steps``, ``adjust_scheduler``,
            ``sync_with_dataloader`` and ``sync_each_batch`` (``GradientAccumulationPlugin``).
    """

    _shared_state: dict[str, Any] = {}

    def __init__(self, gradient_accumulation_plugin: Any = None) -> None:
        self.__dict__ = self._shared_state
        if not self._shared_state.get("_initialized"):
            self.sync_gradients = True
            self.active_dataloader: Any = None
            self.dataloader_references: list[Any] = [None]
            self.plugin_kwargs: dict[str, Any] = {
                "num_steps": 1,
                "adjust_scheduler": True,
                "sync_with_dataloader": True,
                "sync_each_batch": False,
            }
            self._is_xla_gradients_synced = False
            self._initialized = True
        if gradient_accumulation_plugin is not None:
            self.plugin_kwargs = {
                key: getattr(gradient_accumulation_plugin, key, self.plugin_kwargs[key])
                for key in ("num_steps", "adjust_scheduler", "sync_with_dataloader", "sync_each_batch")
            }

    @property
    def initialized(self) -> bool:
        """True once the gradient state has been set up in this process."""
        return self._shared_state.get("_initialized", False)

    @property
    def num_steps(self) -> int:
        """Number of batches over which gradients accumulate."""
        return int(self.plugin_kwargs["num_steps"])

    @property
    def adjust_scheduler(self) -> bool:
        """Whether a prepared scheduler steps only when the gradients are synchronised (from the accumulation plugin)."""
        return bool(self.plugin_kwargs["adjust_scheduler"])

    @property
    def sync_with_dataloader(self) -> bool:
        """Whether the end of the data loader forces a gradient synchronisation (from the accumulation plugin)."""
        return bool(self.plugin_kwargs["sync_with_dataloader"])

    @property
    def sync_each_batch(self) -> bool:
        """Whether gradients are synchronised on every batch even while accumulating (from the accumulation plugin)."""
        return bool(self.plugin_kwargs["sync_each_batch"])

    @property
    def end_of_dataloader(self) -> bool:
        """True while the active data loader yields its last batch."""
        return bool(getattr(self.active_dataloader, "end_of_dataloader", False)) if self.in_dataloader else False

    @property
    def remainder(self) -> int:
        """Real samples in the last global batch of the active loader (dataset length modulo the global
        batch size; 0 when it divides evenly, -1 when unknown)."""
        return int(getattr(self.active_dataloader, "remainder", -1)) if self.in_dataloader else -1

    @property
    def in_dataloader(self) -> bool:
        """True while iterating a prepared data loader."""
        return self.active_dataloader is not None

    @property
    def is_xla_gradients_synced(self) -> bool:
        """Whether XLA gradients were already reduced in this step (TPU)."""
        return self._is_xla_gradients_synced

    @is_xla_gradients_synced.setter
    def is_xla_gradients_synced(self, value: bool) -> None:
        """Whether XLA gradients were already reduced in this step (TPU)."""
        self._is_xla_gradients_synced = value

    def _set_sync_gradients(self, sync_gradients: bool) -> None:
        self.sync_gradients = sync_gradients

    def _add_dataloader(self, dataloader: Any) -> None:
        self.active_dataloader = dataloader
        self.dataloader_references.append(dataloader)

    def _remove_dataloader(self, dataloader: Any) -> None:
        if dataloader in self.dataloader_references:
            self.dataloader_references.remove(dataloader)
        self.active_dataloader = self.dataloader_references[-1]

    def __repr__(self) -> str:
        return (
            f"Sync Gradients: {self.sync_gradients}\nAt end of current dataloader: {self.end_of_dataloader}\n"
            f"Extra samples added: {self.remainder}\nGradient accumulation plugin: {self.plugin_kwargs}\n"
        )

    @staticmethod
    def _reset_state() -> None:
        GradientState._shared_state.clear()


def _barrier() -> None:
    """``torch.distributed.barrier``, named in the error when a process never reaches it (accel_state.hangs)."""
    import torch.distributed as dist

    from accel_state.hangs import watched_collective

    watched_collective("wait_for_everyone")(dist.barrier)()
