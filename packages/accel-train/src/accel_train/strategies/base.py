"""The strategy base class: one process per model replica, nothing sharded.

A strategy owns everything that depends on how a model is spread over processes:

- **set-up** of the models, optimizers and schedulers of one ``prepare`` call *together*
  (`Strategy.setup()`), so that a backend can wrap a model and then rebind its optimizer, or
  initialise all three in one call;
- the **training step**: `backward()`, `no_sync()` for gradient accumulation,
  `clip_grad_norm_()` over (possibly sharded) gradients, the wrappers of optimizers and
  schedulers;
- **state**: unwrapping, full state dicts of models and optimizers (every rank takes part when
  `is_sharded`), and the model/optimizer entries of ``save_state`` checkpoints;
- **data loaders**: `setup_data_loader()` shards a loader over the data-parallel ranks (a backend
  may wrap it: XLA's device loader, a pipeline stage that reads no data);
- the **precisions** it runs with (`Strategy.precisions`, checked by `check_precision()`:
  the one compatibility table between strategies and ``mixed_precision`` modes);
- the **facts** the Accelerator reports: device mesh, data/tensor/context/pipeline parallel ranks and sizes.

The base class is also the single-device behaviour; subclasses override only what differs. The
precision (`accel_train.precisions`) and the checkpoint I/O are given to the strategy by the
connector; the strategy calls the precision's hooks and never looks at the mixed-precision mode.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from accel_state.enums import PrecisionType
from accel_train.precisions.base import Precision
from accel_train.wrappers import compile_model, unwrap_model

if TYPE_CHECKING:
    from accel_train.checkpoint.file_io import CheckpointIO
from accel_train.optimizer import unwrap_optimizer

__all__ = [
    "CheckpointEntry",
    "ParallelDims",
    "Prepared",
    "Strategy",
    "parameter_locations",
    "rebind_optimizer_parameters",
]


@dataclass(frozen=True)
class ParallelDims:
    """Sizes and this process's ranks along each parallel dimension (1 / 0 where unused).

    Checked once, when built: every size is at least 1 and every rank lies in ``[0, size)``.
    ``pp`` is the pipeline dimension (stages); ``ep`` the expert-parallel one, whose ranks hold different
    experts and read different batches. Data loaders shard over the data-parallel ranks
    (``dp_replicate`` x ``dp_shard`` x ``ep``) only.
    """

    dp_replicate_size: int = 1
    dp_shard_size: int = 1
    tp_size: int = 1
    cp_size: int = 1
    dp_replicate_rank: int = 0
    dp_shard_rank: int = 0
    tp_rank: int = 0
    cp_rank: int = 0
    pp_size: int = 1
    pp_rank: int = 0
    ep_size: int = 1
    ep_rank: int = 0

    def __post_init__(self) -> None:
        for dim in ("dp_replicate", "dp_shard", "tp", "cp", "pp", "ep"):
            size, rank = getattr(self, f"{dim}_size"), getattr(self, f"{dim}_rank")
            if not isinstance(size, int) or size < 1:
                raise ValueError(f"ParallelDims.{dim}_size must be an integer >= 1, got {size!r}")
            if not isinstance(rank, int) or not 0 <= rank < size:
                raise ValueError(f"ParallelDims.{dim}_rank must be in [0, {size}), got {rank!r}")

    @property
    def world_size(self) -> int:
        """The number of processes these dimensions span (their product)."""
        return self.data_parallel_size * self.tp_size * self.cp_size * self.pp_size

    @property
    def data_parallel_size(self) -> int:
        """Ranks reading different batches: ``dp_replicate`` x ``dp_shard`` x ``ep``."""
        return self.dp_replicate_size * self.dp_shard_size * self.ep_size

    @property
    def data_parallel_rank(self) -> int:
        """This process's index among `data_parallel_size`, in mesh order (``ep`` innermost)."""
        return (self.dp_replicate_rank * self.dp_shard_size + self.dp_shard_rank) * self.ep_size + self.ep_rank


@dataclass
class Prepared:
    """The models, optimizers and schedulers of one ``prepare`` call, in the order given."""

    models: list[Any]
    optimizers: list[Any]
    schedulers: list[Any]


@dataclass(frozen=True)
class CheckpointEntry:
    """How one kind of object (models, optimizers) appears in a checkpoint folder.

    ``pattern`` is a regular expression over folder entries whose first group is the index (empty
    for index 0); ``name(index)`` gives the entry written for that index. ``sharded`` says that the
    entry is a ``torch.distributed.checkpoint`` folder, whose ``.metadata`` names the files read (the
    pre-load check then judges that metadata and its items); otherwise a ``.metadata`` in it is refused.
    """

    pattern: str
    name: Callable[[int], str]
    sharded: bool = False


def parameter_locations(
    models: Sequence[torch.nn.Module], name: Callable[[str], str] = lambda qualified: qualified
) -> dict[int, tuple[int, str]]:
    """Where each parameter of ``models`` is, recorded before a set-up replaces the parameters.

    A backend that swaps parameters (DTensors of tensor parallelism, FSDP2's shards) records this,
    sets the models up, and hands it to `rebind_optimizer_parameters()`.

    Args:
        models: the models of one ``prepare`` call, in order.
        name: maps a parameter's qualified name to the name looked up after set-up (for instance one
            without the prefixes that wrappers add).

    Returns:
        ``id(parameter) -> (index of its model, name(qualified name))``.
    """
    return {id(p): (index, name(qualified)) for index, m in enumerate(models) for qualified, p in m.named_parameters()}


def rebind_optimizer_parameters(
    optimizer: torch.optim.Optimizer,
    locations: dict[int, tuple[int, str]],
    new_params: Sequence[dict[str, Any]],
    dropped: Container[str] = (),
) -> None:
    """Point ``optimizer`` at the parameters that replaced the ones it was built over, in place.

    Each parameter of each param group is looked up by its location and replaced by the new parameter
    of that name; optimizer state loaded before ``prepare`` moves with its parameter. Group order and
    settings are kept.

    Args:
        optimizer: an optimizer built over the models before they were set up.
        locations: `parameter_locations()` of those models, taken before set-up.
        new_params: per model (same order), the set-up model's parameters by name.
        dropped: names of parameters the set-up removed from this process (experts another process
            holds): they leave the optimizer, with their state.

    Raises:
        KeyError: a parameter of the optimizer is not in ``locations``, or its name is not in ``new_params``
            (the caller checks that the optimizer belongs to these models first).
    """
    for group in optimizer.param_groups:
        rebound = []
        for param in group["params"]:
            index, name = locations[id(param)]
            if name not in new_params[index] and name in dropped:
                optimizer.state.pop(param, None)
                continue
            new = new_params[index][name]
            if param in optimizer.state:  # state loaded before prepare follows its parameter
                optimizer.state[new] = optimizer.state.pop(param)
            rebound.append(new)
        group["params"] = rebound


class Strategy:
    """One device per process, no wrapping: the behaviour of a single-process run."""

    #: Registered name (see `accel_train.strategies`).
    name: ClassVar[str] = "single_device"
    #: Model and optimizer state is split over processes: every rank takes part in state dicts.
    is_sharded: ClassVar[bool] = False
    #: Every process holds the whole model and ``save_state`` into an explicit folder is the writer's
    #: alone: the other processes add only their own files (random states) once it is published, so
    #: ``if accelerator.is_main_process: accelerator.save_state(path)`` works as documented for DDP.
    #: A strategy whose save is a collective (sharded state, XLA's rendezvous) leaves it `False`.
    main_process_saves_alone: ClassVar[bool] = False
    #: ``optimizer.step`` / ``zero_grad`` of the prepared optimizer are driven by the backend.
    backend_steps_optimizer: ClassVar[bool] = False
    #: The ``mixed_precision`` modes this strategy runs with: the one compatibility table between
    #: strategies and precisions (a precision does not list strategies). Checked by `check_precision()`.
    precisions: ClassVar[frozenset[PrecisionType]] = frozenset(PrecisionType)

    def __init__(
        self,
        state: Any,
        precision: Precision,
        checkpoint_io: CheckpointIO | None = None,
        handlers: dict[str, Any] | None = None,
    ) -> None:
        self.state = state
        self.precision = precision
        self._checkpoint_io = checkpoint_io
        self.handlers = handlers or {}

    @property
    def checkpoint_io(self) -> CheckpointIO:
        """The object that writes and reads checkpoint files (built on first use)."""
        if self._checkpoint_io is None:
            from accel_train.checkpoint.file_io import CheckpointIO

            self._checkpoint_io = CheckpointIO()
        return self._checkpoint_io

    # -- building blocks the connector asks for before the strategy exists ------------------------

    @classmethod
    def grad_scaler_factory(cls) -> Callable[..., Any] | None:
        """The fp16 gradient scaler class for this strategy (``None``: ``torch.amp.GradScaler``)."""
        return None

    @classmethod
    def precision_for(cls, precision_cls: type[Precision], mode: str) -> type[Precision]:
        """The precision class to build for ``mode`` under this strategy (default: the registered one).

        A backend that does mixed precision itself (DeepSpeed's engine) gives a class without
        autocast or gradient scaler.
        """
        return precision_cls

    @classmethod
    def resolved_mixed_precision(cls, state: Any, mode: str) -> str:
        """The mode the run trains in when ``mode`` is asked for (default: ``mode`` itself).

        The connector calls it once, after `validate()` and before the precision is built: the precision
        is built for this mode and the state reports it. A backend whose own config may decide the
        precision (DeepSpeed's, as documented) answers from that config.
        """
        return mode

    @classmethod
    def apply_settings(cls, state: Any, requested_mode: str, precision: Precision) -> None:
        """Write this backend's resolved settings where the documented system puts them (a plugin field
        users read back), once, before the strategy is built (default: nothing to write).

        The connector is the only caller: a strategy never writes to its plugins or to the state itself.

        Args:
            state: the run's ``AcceleratorState`` (its plugins).
            requested_mode: the ``mixed_precision`` the run asked for (before `resolved_mixed_precision()`).
            precision: the precision built for the resolved mode.
        """

    @classmethod
    def check_precision(cls, state: Any, mode: PrecisionType, precision_cls: type[Precision] | None = None) -> None:
        """Raise a ``ValueError`` naming the strategy and what it runs with when it cannot run ``mode``.

        The built-in table is `precisions`; a precision registered from outside may narrow it
        with its ``supported_strategies``. A subclass may add conditions that depend on its plugin
        (for example FP8 only with FSDP2). Called once, by the connector.

        Args:
            state: the ``AcceleratorState`` of the run (its plugins).
            mode: the parsed ``mixed_precision``.
            precision_cls: the precision class registered for ``mode``.
        """
        if mode not in cls.precisions:
            raise ValueError(
                f"mixed_precision={mode.value!r} cannot run with the {cls.name} strategy; it runs with "
                f"{sorted(m.value for m in cls.precisions)}"
            )
        allowed = getattr(precision_cls, "supported_strategies", None)
        if allowed is not None and cls.name not in allowed:
            raise ValueError(
                f"mixed_precision={mode.value!r} cannot run with the {cls.name} strategy; it runs with {sorted(allowed)}"
            )

    @classmethod
    def validate(cls, state: Any, precision_cls: type[Precision], mode: str) -> None:
        """Raise when this strategy cannot run with the configuration (called once by the connector)."""

    # -- facts ----------------------------------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        return self.state.device

    @property
    def parallel_dims(self) -> ParallelDims:
        """Every process is one data-parallel replica."""
        return ParallelDims(dp_replicate_size=self.state.num_processes, dp_replicate_rank=self.state.process_index)

    @property
    def device_mesh(self) -> Any:
        """The ``torch.distributed.DeviceMesh`` of the run (``None`` when the strategy uses none)."""
        return None

    @property
    def is_composable_parallelism_enabled(self) -> bool:
        """True when models are spread over a device mesh of several parallel dimensions."""
        return False

    @property
    def expert_token_counts(self) -> dict[str, torch.Tensor]:
        """Per expert module, this process's tokens routed to each expert in its latest forward; empty
        unless the strategy splits experts over processes (expert parallelism)."""
        return {}

    # -- set-up -------------------------------------------------------------------------------------

    def setup(
        self,
        models: Sequence[torch.nn.Module],
        optimizers: Sequence[torch.optim.Optimizer],
        schedulers: Sequence[Any],
        device_placement: Sequence[bool],
        evaluation_mode: bool = False,
        data_loaders: Sequence[Any] = (),
    ) -> Prepared:
        """Prepare the objects of one ``prepare`` call together (``device_placement`` per model).

        ``data_loaders`` are the data loaders prepared by the same ``prepare`` call (a backend may read
        their batch size; loaders of earlier calls are not given, as documented).
        """
        prepared = [
            self.setup_model(model, placement, evaluation_mode) for model, placement in zip(models, device_placement)
        ]
        return Prepared(prepared, [self.setup_optimizer(o, prepared) for o in optimizers], list(schedulers))

    def setup_model(
        self, model: torch.nn.Module, device_placement: bool = True, evaluation_mode: bool = False
    ) -> torch.nn.Module:
        """Place the model, convert it for the precision, wrap it (unless evaluating), compile it.

        A model loaded in 8/4-bit stays where it was loaded; training it is checked against the
        documented rules (trainable adapters, no offload, on the training device).
        """
        quantized = _is_low_bit(model)
        if quantized and not evaluation_mode:
            from accel_quant.training import check_trainable_quantized_model

            check_trainable_quantized_model(model, device=self.device, distributed=self.state.num_processes > 1)
        # A dispatched model (device map) or one whose offload hooks hold some weights (those are on
        # ``meta`` here; prepare refused any that nothing holds) stays where its hooks put it.
        if (
            device_placement
            and not quantized
            and getattr(model, "hf_device_map", None) is None
            and not _has_meta(model)
        ):
            model = model.to(self.device)
        model = self.precision.convert_module(model)
        if not evaluation_mode:
            model = self.wrap_model(model)
        return self.compile(model)

    def materialises_meta_weights(self, evaluation_mode: bool = False) -> bool:
        """Whether this backend gives values to a model's ``meta`` weights itself, so that ``prepare``
        accepts weights that no offload hook holds (FSDP's sharded set-up, Megatron-LM). Others: no.

        Args:
            evaluation_mode: the model is prepared for inference only.
        """
        return False

    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """The backend's wrapper around the model (none on one device)."""
        return model

    def compile(self, model: torch.nn.Module) -> torch.nn.Module:
        """``torch.compile`` the model when the dynamo plugin asks for it."""
        plugin = getattr(self.state, "dynamo_plugin", None)
        if plugin is not None and plugin.enabled:
            return compile_model(model, plugin)
        return model

    def setup_optimizer(
        self, optimizer: torch.optim.Optimizer, models: Sequence[torch.nn.Module]
    ) -> torch.optim.Optimizer:
        """The optimizer over the prepared models' parameters (the same object when they did not change)."""
        return optimizer

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer, device_placement: bool) -> Any:
        """The prepared optimizer: steps on sync steps only, through the precision."""
        from accel_train.optimizer import AcceleratedOptimizer

        return AcceleratedOptimizer(optimizer, device_placement=device_placement, precision=self.precision)

    def wrap_scheduler(self, scheduler: Any, optimizers: Any, step_with_optimizer: bool, split_batches: bool) -> Any:
        """The prepared scheduler: follows the optimizer's real steps."""
        from accel_train.scheduler import AcceleratedScheduler

        return AcceleratedScheduler(
            scheduler, optimizers, step_with_optimizer=step_with_optimizer, split_batches=split_batches
        )

    # -- data loaders -----------------------------------------------------------------------------

    def setup_data_loader(self, data_loader: Any, **options: Any) -> Any:
        """The prepared data loader: sharded over the data-parallel ranks of `parallel_dims`.

        Processes that share a data-parallel rank (tensor, context or pipeline peers) get the same
        batches. A backend overrides this to wrap the loader (a device loader, a pipeline stage that
        reads no data).

        Args:
            data_loader: the user's ``torch.utils.data.DataLoader``.
            **options: the Accelerator's data-loader settings, passed on to
                ``accel_data.prepare_data_loader`` (``split_batches``, ``put_on_device``, ...).

        Returns:
            The prepared loader.
        """
        from accel_data import prepare_data_loader

        dims = self.parallel_dims
        return prepare_data_loader(
            data_loader,
            self.device,
            num_processes=dims.data_parallel_size,
            process_index=dims.data_parallel_rank,
            **options,
        )

    def skip_first_batches(self, dataloader: Any, num_batches: int) -> Any:
        """The loader that starts after ``num_batches`` batches (``accel_data.skip_first_batches``); a backend
        that wraps its loaders (`setup_data_loader()`) skips in the loader it wraps and wraps the result.

        Args:
            dataloader: a data loader (prepared or not).
            num_batches: how many batches to skip.
        """
        from accel_data import skip_first_batches

        return skip_first_batches(dataloader, num_batches=num_batches)

    # -- training step ------------------------------------------------------------------------------

    def backward(self, loss: torch.Tensor, accumulation_steps: int = 1, **kwargs: Any) -> None:
        """Backward of ``loss`` divided by the accumulation steps, through the precision."""
        if accumulation_steps != 1:
            loss = loss / accumulation_steps
        self.precision.backward(loss, **kwargs)

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
        """Context in which backward keeps gradients local (accumulation); nothing to skip here."""
        return contextlib.nullcontext()

    def force_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
        """Context in which the next backward synchronises gradients even inside `no_sync()`."""
        return contextlib.nullcontext()

    def join(self, joinables: list[Any]) -> contextlib.AbstractContextManager[Any]:
        """Context for uneven inputs across processes (nothing to join on one process)."""
        return contextlib.nullcontext()

    def context_parallel(
        self, buffers: Any = None, buffer_seq_dims: Any = None, no_restore_buffers: Any = None
    ) -> contextlib.AbstractContextManager[Any]:
        """Context sharding ``buffers`` over context-parallel ranks (nothing without context parallelism)."""
        return contextlib.nullcontext()

    def ulysses_dl_adapter(self, dataloader: Any, model: Any) -> Any:
        """The data loader adapted for the backend's sequence parallelism (the same loader without it);
        behind ``Accelerator.deepspeed_ulysses_dl_adapter``."""
        return dataloader

    def unscale_gradients(self, optimizers: Iterable[Any]) -> None:
        """Divide scaled gradients by the scale, once per optimizer."""
        for optimizer in optimizers:
            self.precision.unscale_(unwrap_optimizer(optimizer))

    def clip_grad_norm_(
        self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float, optimizers: Iterable[Any]
    ) -> torch.Tensor:
        """Clip gradients by their total norm (after unscaling); returns the norm before clipping."""
        parameters = list(parameters)
        self.unscale_gradients(optimizers)
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    def clip_grad_value_(
        self, parameters: Iterable[torch.Tensor], clip_value: float, optimizers: Iterable[Any]
    ) -> None:
        parameters = list(parameters)
        self.unscale_gradients(optimizers)
        torch.nn.utils.clip_grad_value_(parameters, clip_value)

    # -- models and their state -----------------------------------------------------------------------

    def unwrap_model(self, model: Any, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True) -> Any:
        """The user's model from inside the strategy's and ``torch.compile``'s wrappers."""
        return unwrap_model(model, keep_fp32_wrapper=keep_fp32_wrapper, keep_torch_compile=keep_torch_compile)

    def model_state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, Any]:
        """The full state dict of ``model`` (gathered from every rank when sharded)."""
        if unwrap:
            model = self.unwrap_model(model, keep_torch_compile=False)
        return _materialised(model)

    def optimizer_state_dict(self, optimizer: Any) -> dict[str, Any]:
        """The full optimizer state dict (every rank takes part when sharded)."""
        return optimizer.state_dict()

    def load_optimizer_state_dict(self, optimizer: Any, state_dict: dict[str, Any]) -> None:
        optimizer.load_state_dict(state_dict)

    def accumulated_gradients(self, models: Sequence[torch.nn.Module]) -> dict[str, torch.Tensor]:
        """The gradients gathered so far between two optimizer steps, keyed ``"<model index>.<name>"``: this
        process's own (under data parallelism each process holds its part until the step reduces them).

        Args:
            models: the prepared models, in order.
        """
        from accel_train.checkpoint.file_io import accumulated_gradients

        return accumulated_gradients([self.unwrap_model(m, keep_torch_compile=False) for m in models])

    def restore_gradients(self, models: Sequence[torch.nn.Module], grads: dict[str, torch.Tensor] | None) -> None:
        """Put back what `accumulated_gradients()` returned (``None``: no gradient, as after ``zero_grad``).

        Args:
            models: the prepared models, in order.
            grads: the saved gradients, or ``None``.
        """
        from accel_train.checkpoint.file_io import restore_gradients

        restore_gradients([self.unwrap_model(m, keep_torch_compile=False) for m in models], grads)

    # -- checkpoint entries (save_state / load_state) -------------------------------------------------

    def checkpoint_entries(self) -> dict[str, CheckpointEntry]:
        """How models and optimizers appear in a checkpoint folder (the documented file names)."""
        from accel_train import checkpointing as ckpt

        return {
            "model": CheckpointEntry(ckpt.MODEL_FILE_PATTERN, lambda i: ckpt.model_file(i, True)),
            "optimizer": CheckpointEntry(ckpt.OPTIMIZER_FILE_PATTERN, ckpt.optimizer_file),
        }

    def checkpoint_settings(self) -> dict[str, Any]:
        """This backend's main settings as plain JSON values, recorded in the checkpoint's manifest
        (``backend_settings``) so that a resume can say which of them changed (none here)."""
        return {}

    def checkpoint_weights(self, model: torch.nn.Module) -> dict[str, Any] | None:
        """The weights ``save_state`` writes and shows its pre-hooks (``None``: the strategy writes shards)."""
        return self.model_state_dict(model)

    def async_save_refusal(self) -> str | None:
        """Why ``save_state(async_save=True)`` cannot stage this strategy's checkpoint (`None`: it can).

        One device and DDP can: every process holds the whole state. A sharded strategy that can hand its
        shards over as copies (`staged_shards()`) overrides this."""
        if self.name in ("single_device", "ddp"):
            return None
        return f"the {self.name!r} backend writes its checkpoint together with the other processes"

    def staged_shards(self, model: torch.nn.Module) -> dict[str, Any] | None:
        """This process's shards of ``model`` as the asynchronous save copies them (`None`: not sharded)."""
        return None

    def staged_optimizer_state(self, optimizer: Any) -> Any:
        """The optimizer state an asynchronous save copies: what `save_optimizer_checkpoint()` writes."""
        return self.optimizer_state_dict(optimizer)

    def save_model_checkpoint(
        self,
        model: torch.nn.Module,
        weights: dict[str, Any] | None,
        folder: str,
        index: int,
        safe_serialization: bool,
        is_writer: bool,
    ) -> str | None:
        """Write model ``index`` into ``folder``; called on every rank. Returns the entry written."""
        from accel_train import checkpointing as ckpt

        name = ckpt.model_file(index, safe_serialization)
        if is_writer and weights is not None:
            self.checkpoint_io.save_weights(weights, os.path.join(folder, name), safe_serialization)
        return name

    def load_model_checkpoint(
        self, model: torch.nn.Module, folder: str, entry: str, device: Any, strict: bool = True
    ) -> None:
        """Load model weights from ``folder/entry`` into ``model``; called on every rank."""
        target = self.unwrap_model(model, keep_torch_compile=False)
        path = os.path.join(folder, entry)
        self.checkpoint_io.load_into_model(target, self.checkpoint_io.load_weights(path, device), path, strict)

    def save_optimizer_checkpoint(self, optimizer: Any, folder: str, index: int, is_writer: bool) -> str | None:
        """Write optimizer ``index`` into ``folder``; called on every rank. Returns the entry written."""
        from accel_train import checkpointing as ckpt

        name = ckpt.optimizer_file(index)
        state = self.optimizer_state_dict(optimizer)
        if is_writer:
            self.checkpoint_io.save_object(state, os.path.join(folder, name))
        return name

    def load_optimizer_checkpoint(self, optimizer: Any, folder: str, index: int, map_location: Any) -> None:
        from accel_train import checkpointing as ckpt

        path = os.path.join(folder, ckpt.optimizer_file(index))
        self.load_optimizer_state_dict(optimizer, self.checkpoint_io.load_object(path, map_location=map_location))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={self.device}, precision={self.precision!r})"


def _is_low_bit(model: torch.nn.Module) -> bool:
    """True for a model loaded in 8/4-bit (flagged, or holding bitsandbytes layers, which needs bitsandbytes loaded)."""
    if getattr(model, "is_loaded_in_8bit", False) or getattr(model, "is_loaded_in_4bit", False):
        return True
    if "bitsandbytes" not in sys.modules:
        return False
    from accel_quant.training import is_bnb_quantized

    return bool(is_bnb_quantized(model))


def _has_meta(model: torch.nn.Module) -> bool:
    return any(t.device.type == "meta" for t in itertools.chain(model.parameters(), model.buffers()))


def _materialised(model: torch.nn.Module) -> dict[str, Any]:
    """``model.state_dict()``; weights of layers offloaded by accel-bigmodel's hooks are read back."""
    state_dict = model.state_dict()
    if not any(isinstance(v, torch.Tensor) and v.device.type == "meta" for v in state_dict.values()):
        return state_dict
    from accel_train.weights.offloaded import materialise_offloaded

    return materialise_offloaded(model, state_dict)
