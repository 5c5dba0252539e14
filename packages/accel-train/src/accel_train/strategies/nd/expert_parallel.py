"""Expert parallelism: the experts of each mixture-of-experts block split over the ``ep`` processes.

Every process runs the whole model on its own batch; at each expert module (the contract of
`accel_bigmodel.experts`) the routed tokens travel to the process holding their expert and back:

1. this process's (token, choice) pairs are sorted by expert; the per-expert counts go to every ``ep``
   peer (an all-to-all of ``num_experts`` integers), so each process knows how many rows it receives;
2. the hidden states of the pairs go out with an all-to-all (``dispatch``);
3. the module's **own forward** runs on the received rows over its local experts only (the stacked
   parameters narrowed to this process's ``num_experts / ep`` experts, every weight 1), so whatever the
   experts compute (transformers' SwiGLU, gpt-oss's clamped GLU with biases, a user's MLP) is unchanged;
4. the outputs come back with the reverse all-to-all (``combine``) and are weighted by the router's
   weights and summed per token, as the module does itself.

Stacked parameters become DTensors sharded on dimension 0 over the ``ep`` mesh, so checkpoints
(``torch.distributed.checkpoint``) keep one ordinary ``[num_experts, ...]`` tensor per name, full state
dicts gather into that layout, and a resume with another ``ep_size`` reshards. A list of experts keeps
only this process's entries, under their own indices (`LocalExperts`): checkpoint keys stay those of
the unsplit model (each process writes its experts' keys), and `gather_listed_experts()` completes a full
state dict from the ``ep`` peers.

Gradients: a process's experts receive the contributions of every ``ep`` peer's loss through the
all-to-all's backward; each peer's loss is its own batch's mean, so the experts' part of the gradient is
scaled by ``1 / ep`` (on the way out of the experts, and undone on the way into them, so the tokens'
gradients are unchanged) and averaged over the ranks holding the same experts by FSDP2
(``dp_replicate`` x ``dp_shard``): the gradient of the mean loss over all processes. Every process takes
part in every all-to-all, forward and backward, even when it sends or receives no rows.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from accel_bigmodel.experts import ExpertModule, find_expert_modules

__all__ = [
    "ExpertParallelForward",
    "LocalExperts",
    "SplitExperts",
    "apply_expert_parallel",
    "expert_local_parameters",
    "gather_listed_experts",
]


class _AllToAll(torch.autograd.Function):
    """Rows of ``tensor`` split by ``input_splits`` go to the ranks of ``group``; rows split by
    ``output_splits`` arrive. Its gradient travels back the same way, reversed."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, tensor: torch.Tensor, output_splits: list[int], input_splits: list[int], group: Any
    ) -> torch.Tensor:
        import torch.distributed as dist

        ctx.splits, ctx.group = (output_splits, input_splits), group
        received = tensor.new_empty((sum(output_splits), *tensor.shape[1:]))
        dist.all_to_all_single(received, tensor.contiguous(), output_splits, input_splits, group=group)
        return received

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:  # type: ignore[override]
        import torch.distributed as dist

        output_splits, input_splits = ctx.splits
        sent_back = grad.new_empty((sum(input_splits), *grad.shape[1:]))
        dist.all_to_all_single(sent_back, grad.contiguous(), input_splits, output_splits, group=ctx.group)
        return sent_back, None, None, None


class _ScaleGradient(torch.autograd.Function):
    """The identity forward; the gradient multiplied by ``factor`` backward."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, factor: float) -> torch.Tensor:  # type: ignore[override]
        ctx.factor = factor
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return grad * ctx.factor, None


class _JoinGraph(torch.autograd.Function):
    """``output`` unchanged, made to depend on ``anchors`` (zero gradients flow to them).

    A process that receives no rows computes an output that depends on nothing; without this its
    backward would skip the all-to-alls its peers run (a hang), and its experts would get no gradient
    where their FSDP peers get one.
    """

    @staticmethod
    def forward(ctx: Any, output: torch.Tensor, *anchors: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.anchors = [(a.shape, a.dtype, a.device) for a in anchors]
        return output.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        zeros = [
            torch.zeros(shape, dtype=dtype, device=device) if needed else None
            for (shape, dtype, device), needed in zip(ctx.anchors, ctx.needs_input_grad[1:])
        ]
        return (grad, *zeros)


@contextlib.contextmanager
def _parameters_replaced(module: nn.Module, tensors: dict[str, torch.Tensor]) -> Iterator[None]:
    """``module``'s parameters named in ``tensors`` read as those tensors inside the block."""
    saved = {name: module._parameters[name] for name in tensors}
    try:
        module._parameters.update(tensors)  # type: ignore[arg-type]
        yield
    finally:
        module._parameters.update(saved)


class ExpertParallelForward:
    """The forward of one expert module under expert parallelism (installed as the module's ``forward``).

    Args:
        module: the expert module (its stacked parameters already DTensors over the ``ep`` mesh).
        expert: its entry from `find_expert_modules()`.
        group: the process group of the ``ep`` dimension.
        ep_size: the number of processes in ``group``.
        counts: where this forward records, under the module's name, how many of this process's
            (token, choice) pairs each expert received (a ``[num_experts]`` int64 tensor).
        anchor_listed: give a listed expert that received no row a zero gradient, as FSDP2 needs when
            the ranks holding the same experts reduce their gradients together; otherwise such an expert
            keeps no gradient, as in a single process (stacked experts always get one: their tensor does).
    """

    def __init__(
        self,
        module: nn.Module,
        expert: ExpertModule,
        group: Any,
        ep_size: int,
        counts: MutableMapping[str, torch.Tensor],
        anchor_listed: bool = False,
    ) -> None:
        self.module_forward = type(module).forward
        self.anchor_listed = anchor_listed
        self.module: Any = module  # its num_experts is narrowed during a call
        self.expert = expert
        self.group = group
        self.ep_size = ep_size
        self.local_experts = expert.num_experts // ep_size
        self.counts = counts
        self.names = [name for name, _ in module.named_parameters(recurse=False)]

    def _local_parameters(self, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        from torch.distributed.tensor import DTensor

        local = {}
        for name in self.names:
            param = self.module._parameters[name]
            assert param is not None
            tensor = param.to_local() if isinstance(param, DTensor) else param
            if tensor.is_floating_point() and tensor.dtype != dtype:
                tensor = tensor.to(dtype)  # mixed precision: compute in the activations' dtype
            local[name] = tensor
        return local

    def __call__(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        num_experts, ep, local_count = self.expert.num_experts, self.ep_size, self.local_experts
        device = hidden_states.device
        choices = top_k_index.shape[-1]
        expert_of = top_k_index.reshape(-1).long()
        token_of = torch.arange(hidden_states.shape[0], device=device).repeat_interleave(choices)
        weight_of = top_k_weights.reshape(-1)
        routed = (expert_of >= 0) & (expert_of < num_experts)  # an index out of range means "no expert"
        if not bool(routed.all()):
            expert_of, token_of, weight_of = expert_of[routed], token_of[routed], weight_of[routed]
        order = torch.argsort(expert_of, stable=True)
        token_of, weight_of = token_of[order], weight_of[order]
        counts = torch.bincount(expert_of, minlength=num_experts)
        self.counts[self.expert.name] = counts.detach().clone()

        import torch.distributed as dist

        received_counts = torch.empty_like(counts)
        dist.all_to_all_single(received_counts, counts, group=self.group)
        send_splits = counts.view(ep, local_count).sum(1).tolist()
        receive_splits = received_counts.view(ep, local_count).sum(1).tolist()
        dispatched = _AllToAll.apply(hidden_states[token_of], receive_splits, send_splits, self.group)
        # rows arrive grouped by sender, and by expert within a sender (each sender sorted them so)
        local_ids = torch.arange(local_count, device=device).repeat(ep).repeat_interleave(received_counts)
        ones = torch.ones((dispatched.shape[0], 1), dtype=top_k_weights.dtype, device=device)
        local = self._local_parameters(hidden_states.dtype)
        # the experts' gradients scaled by 1/ep, the tokens' left as they are (see the module's docstring)
        inputs = _ScaleGradient.apply(dispatched, float(ep)) if dispatched.requires_grad else dispatched
        original_count = self.expert.num_experts
        try:
            self.module.num_experts = local_count  # the forward loops over its local experts
            with _parameters_replaced(self.module, local):
                output = self.module_forward(self.module, inputs, local_ids.unsqueeze(1), ones)
        finally:
            self.module.num_experts = original_count
        if output.requires_grad:
            output = _ScaleGradient.apply(output, 1.0 / ep)
        held = list(local.values()) if local else list(self.module.parameters()) if self.anchor_listed else []
        anchors = [dispatched, *(t for t in held if t.requires_grad)]
        if torch.is_grad_enabled() and any(a.requires_grad for a in anchors):
            output = _JoinGraph.apply(output, *anchors)
        returned = _AllToAll.apply(output, send_splits, receive_splits, self.group)
        weighted = (returned * weight_of.unsqueeze(1).to(returned.dtype)).to(hidden_states.dtype)
        return torch.zeros_like(hidden_states).index_add(0, token_of, weighted)


def apply_expert_parallel(
    model: nn.Module,
    mesh: Any,
    counts: MutableMapping[str, torch.Tensor],
    experts_sharded: bool = False,
    found: Sequence[ExpertModule] | None = None,
) -> list[SplitExperts]:
    """Split every expert module of ``model`` over the 1-D ``ep`` mesh ``mesh``, in place.

    Each stacked parameter keeps this process's ``num_experts / ep`` experts as the local shard of a DTensor
    (``Shard(0)``) over ``mesh``, taken from this process's own copy (every process built the same model, as
    for FSDP); a list keeps this process's experts in a `LocalExperts` and drops the others. The module's
    forward becomes an `ExpertParallelForward`.

    Args:
        model: the model, on its device.
        mesh: the ``ep`` sub-mesh of the run's device mesh.
        counts: the mapping each module's forward records its per-expert token counts in.
        experts_sharded: FSDP2 will shard the experts over the ranks holding the same ones (see
            `ExpertParallelForward`'s ``anchor_listed``).
        found: ``find_expert_modules(model)`` when the caller has it already (it is not looked for again).

    Returns:
        a `SplitExperts` for each expert module, outermost first.

    Raises:
        ValueError: the model has no expert module, or ``ep`` does not divide a module's expert count.
    """
    from torch.distributed.tensor import DTensor, Shard

    ep = mesh.size()
    rank = mesh.get_local_rank()
    experts = list(found) if found is not None else find_expert_modules(model)
    if not experts:
        raise ValueError(
            f"ParallelismConfig(ep_size={ep}) needs a mixture-of-experts model, but {type(model).__name__} has no "
            "expert module (a module with an int `num_experts`, called as experts(hidden_states, top_k_index, "
            "top_k_weights), whose parameters are stacked [num_experts, ...]); set ep_size=1 for a dense model"
        )
    result = []
    for expert in experts:
        if expert.num_experts % ep:
            raise ValueError(
                f"ParallelismConfig(ep_size={ep}) does not divide the {expert.num_experts} experts of "
                f"{expert.name!r}; choose an ep_size that divides {expert.num_experts}"
            )
        module = model.get_submodule(expert.name)
        local = expert.num_experts // ep
        listed: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
        if expert.layout == "list":
            experts_list = getattr(module, expert.list_name)
            listed = {expert.list_prefix + n: (tuple(p.shape), p.dtype) for n, p in experts_list.named_parameters()}
            setattr(module, expert.list_name, LocalExperts(experts_list, rank * local, local))
        for name, param in list(module.named_parameters(recurse=False)):
            if isinstance(param, DTensor):
                raise ValueError(f"{expert.name}.{name} is already a DTensor; expert parallelism splits plain tensors")
            shard = param.detach()[rank * local : (rank + 1) * local].clone()
            split = DTensor.from_local(shard, mesh, [Shard(0)], run_check=False)
            setattr(module, name, nn.Parameter(split, requires_grad=param.requires_grad))
        module.forward = ExpertParallelForward(  # type: ignore[method-assign]
            module, expert, mesh.get_group(), ep, counts, anchor_listed=experts_sharded
        )
        result.append(SplitExperts(module, expert, rank * local, local, listed))
    return result


@dataclass
class SplitExperts:
    """One expert module after `apply_expert_parallel()`.

    Attributes:
        module: the module (its forward an `ExpertParallelForward`).
        expert: its entry from `find_expert_modules()`.
        first: the index of this process's first expert.
        count: how many experts this process holds.
        listed: for a list of experts, every expert parameter of the unsplit model by qualified name, with
            its shape and dtype (what `gather_listed_experts()` completes); empty for stacked experts.
    """

    module: nn.Module
    expert: ExpertModule
    first: int
    count: int
    listed: dict[str, tuple[tuple[int, ...], torch.dtype]]


class LocalExperts(nn.Module):
    """The experts of a list that this process holds, registered under their indices in the whole list (so
    state-dict keys are those of the unsplit model) and indexed from 0 like the list of local experts that
    the module's forward sees while `ExpertParallelForward` narrows ``num_experts``.

    Args:
        experts: the whole list.
        first: the index of the first expert kept.
        count: how many are kept.
    """

    def __init__(self, experts: nn.ModuleList, first: int, count: int) -> None:
        super().__init__()
        for index in range(first, first + count):
            self.add_module(str(index), experts[index])
        self.first, self.count = first, count

    def __getitem__(self, index: int) -> nn.Module:
        if not -self.count <= index < self.count:
            raise IndexError(f"local expert {index} out of range: this process holds {self.count} experts")
        module = self._modules[str(self.first + index % self.count)]
        assert module is not None
        return module

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[nn.Module]:
        return iter(self[index] for index in range(self.count))


def expert_local_parameters(splits: Sequence[SplitExperts]) -> set[int]:
    """The ids of the parameters that only this process's ``ep`` group holds: listed experts (a norm over
    every parameter adds theirs over ``ep``; stacked ones are DTensors, reduced by DTensor itself).

    Args:
        splits: what `apply_expert_parallel()` returned (after FSDP2 has replaced the parameters).
    """
    return {id(p) for split in splits if split.listed for p in split.module.parameters()}


def gather_listed_experts(
    state: dict[str, Any], splits: Sequence[SplitExperts], group: Any, device: torch.device
) -> dict[str, Any]:
    """``state`` (a full state dict holding this process's listed experts) with every listed expert added,
    each sent by the ``ep`` peer that holds it; call it on every process of ``group``.

    Args:
        state: the full state dict of the model on this process (CPU tensors).
        splits: what `apply_expert_parallel()` returned.
        group: the ``ep`` process group.
        device: the device collectives run on (CPU for gloo, the GPU for NCCL).
    """
    import torch.distributed as dist

    rank = dist.get_rank(group)
    gathered = dict(state)
    for split in splits:
        if not split.listed:
            continue
        prefix = split.expert.list_prefix
        for key, (shape, dtype) in split.listed.items():
            owner = int(key[len(prefix) :].split(".", 1)[0]) // split.count
            if owner == rank:
                dtype = gathered[key].dtype  # FSDP2 may have upcast it since
            code = torch.tensor([_DTYPES.index(dtype) if dtype in _DTYPES else -1], device=device)
            dist.broadcast(code, group=group, group_src=owner)
            if int(code) < 0:
                raise TypeError(f"{key} has dtype {dtype}, which expert gathering does not send")
            buffer = (
                gathered[key].to(device)
                if owner == rank
                else torch.empty(shape, dtype=_DTYPES[int(code)], device=device)
            )
            dist.broadcast(buffer, group=group, group_src=owner)
            gathered[key] = buffer.cpu()
    return _in_model_order(state, gathered, splits)


def _in_model_order(state: dict[str, Any], gathered: dict[str, Any], splits: Sequence[SplitExperts]) -> dict[str, Any]:
    """``gathered`` ordered as the unsplit model's state dict: each list's experts where its first one was."""
    lists = [(s.expert.list_prefix, s) for s in splits if s.listed]
    ordered: dict[str, Any] = {}
    for key in state:
        for prefix, split in lists:
            if key.startswith(prefix):
                ordered.update({name: gathered[name] for name in split.listed})
                break
        else:
            ordered[key] = gathered[key]
    return ordered


_DTYPES = [
    torch.float32,
    torch.bfloat16,
    torch.float16,
    torch.float64,
    torch.int8,
    torch.uint8,
    torch.int32,
    torch.int64,
]
