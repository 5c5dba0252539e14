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

The stacked parameters become DTensors sharded on dimension 0 over the ``ep`` mesh, so checkpoints
(``torch.distributed.checkpoint``) keep one ordinary ``[num_experts, ...]`` tensor per name, full state
dicts gather into that layout, and a resume with another ``ep_size`` reshards. Gradients: a process's
experts receive the contributions of every ``ep`` peer's loss through the all-to-all's backward; each
peer's loss is its own batch's mean, so the expert gradients are scaled by ``1 / ep`` here and averaged
over the ranks holding the same experts by FSDP2 (``dp_replicate`` x ``dp_shard``), which makes them the
gradient of the mean loss over all processes. Every process takes part in every all-to-all, forward and
backward, even when it sends or receives no rows.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, MutableMapping, Sequence
from typing import Any

import torch
from torch import nn

from accel_bigmodel.experts import ExpertModule, find_expert_modules

__all__ = ["ExpertParallelForward", "apply_expert_parallel"]


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
    """

    def __init__(
        self,
        module: nn.Module,
        expert: ExpertModule,
        group: Any,
        ep_size: int,
        counts: MutableMapping[str, torch.Tensor],
    ) -> None:
        self.module_forward = type(module).forward
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
            if tensor.requires_grad:
                tensor = _ScaleGradient.apply(tensor, 1.0 / self.ep_size)
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
        original_count = self.expert.num_experts
        try:
            self.module.num_experts = local_count  # the forward loops over its local experts
            with _parameters_replaced(self.module, local):
                output = self.module_forward(self.module, dispatched, local_ids.unsqueeze(1), ones)
        finally:
            self.module.num_experts = original_count
        anchors = [dispatched, *(t for t in local.values() if t.requires_grad)]
        if torch.is_grad_enabled() and any(a.requires_grad for a in anchors):
            output = _JoinGraph.apply(output, *anchors)
        returned = _AllToAll.apply(output, send_splits, receive_splits, self.group)
        weighted = (returned * weight_of.unsqueeze(1).to(returned.dtype)).to(hidden_states.dtype)
        return torch.zeros_like(hidden_states).index_add(0, token_of, weighted)


def apply_expert_parallel(
    model: nn.Module, mesh: Any, counts: MutableMapping[str, torch.Tensor]
) -> list[tuple[nn.Module, ExpertModule]]:
    """Split every expert module of ``model`` over the 1-D ``ep`` mesh ``mesh``, in place.

    Each stacked parameter keeps this process's ``num_experts / ep`` experts as the local shard of a DTensor
    (``Shard(0)``) over ``mesh``, taken from this process's own copy (every process built the same model, as
    for FSDP); the module's forward becomes an `ExpertParallelForward`.

    Args:
        model: the model, on its device.
        mesh: the ``ep`` sub-mesh of the run's device mesh.
        counts: the mapping each module's forward records its per-expert token counts in.

    Returns:
        ``(module, entry)`` for each expert module, outermost first.

    Raises:
        ValueError: the model has no expert module, or ``ep`` does not divide a module's expert count.
        NotImplementedError: an expert module holds its experts as a list (stack them).
    """
    from torch.distributed.tensor import DTensor, Shard

    ep = mesh.size()
    rank = mesh.get_local_rank()
    experts = find_expert_modules(model)
    if not experts:
        raise ValueError(
            f"ParallelismConfig(ep_size={ep}) needs a mixture-of-experts model, but {type(model).__name__} has no "
            "expert module (a module with an int `num_experts`, called as experts(hidden_states, top_k_index, "
            "top_k_weights), whose parameters are stacked [num_experts, ...]); set ep_size=1 for a dense model"
        )
    result = []
    for expert in experts:
        if expert.layout == "list":
            raise NotImplementedError(
                f"expert module {expert.name!r} holds its {expert.num_experts} experts as a list "
                f"({expert.list_name!r}); expert parallelism splits stacked expert parameters "
                "[num_experts, ...] (as transformers' *Experts modules): stack the experts' weights, or set ep_size=1"
            )
        if expert.num_experts % ep:
            raise ValueError(
                f"ParallelismConfig(ep_size={ep}) does not divide the {expert.num_experts} experts of "
                f"{expert.name!r}; choose an ep_size that divides {expert.num_experts}"
            )
        module = model.get_submodule(expert.name)
        local = expert.num_experts // ep
        for name, param in list(module.named_parameters(recurse=False)):
            if isinstance(param, DTensor):
                raise ValueError(f"{expert.name}.{name} is already a DTensor; expert parallelism splits plain tensors")
            shard = param.detach()[rank * local : (rank + 1) * local].clone()
            split = DTensor.from_local(shard, mesh, [Shard(0)], run_check=False)
            setattr(module, name, nn.Parameter(split, requires_grad=param.requires_grad))
        module.forward = ExpertParallelForward(module, expert, mesh.get_group(), ep, counts)  # type: ignore[method-assign]
        result.append((module, expert))
    return result


def expert_parameters(modules: Sequence[tuple[nn.Module, ExpertModule]]) -> list[nn.Parameter]:
    """The expert parameters of the modules `apply_expert_parallel()` returned.

    Args:
        modules: its result.
    """
    return [p for module, _ in modules for p in module.parameters(recurse=False)]
