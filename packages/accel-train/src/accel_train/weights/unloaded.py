"""Refuse, before anything moves, a model whose weights were never loaded.

A model built under ``init_empty_weights()`` holds ``meta`` tensors: shapes without values. Moving it
to a device fails deep inside torch ("Cannot copy out of meta tensor"), and one left where it is fails
at its first forward. A ``meta`` tensor is legitimate only when an offload hook of accel-bigmodel
(``cpu_offload``, ``disk_offload``, ``dispatch_model`` with CPU or disk entries) keeps its value
elsewhere and brings it in for the forward; `unloaded_weights` names the others.
"""

from __future__ import annotations

import itertools

import torch

from accel_train.weights.offloaded import offload_holder

__all__ = ["UnloadedWeightsError", "unloaded_weights"]

#: How many tensor names the error lists.
SHOWN = 5


class UnloadedWeightsError(ValueError, NotImplementedError):
    """A model passed to ``prepare`` has weights on the ``meta`` device that no offload hook holds.

    A ``ValueError`` (the model is not usable as given); also a ``NotImplementedError``, the class of
    torch's own "Cannot copy out of meta tensor" error that code written for the documented system may
    catch. ``names`` lists every such parameter and buffer, ``total`` counts the model's tensors.

    Args:
        model_name: the model's class name.
        names: the parameters and buffers on ``meta`` that nothing holds.
        total: how many parameters and buffers the model has.
    """

    def __init__(self, model_name: str, names: list[str], total: int) -> None:
        self.model_name = model_name
        self.names = list(names)
        self.total = total
        shown = ", ".join(repr(n) for n in self.names[:SHOWN])
        more = f" and {len(self.names) - SHOWN} more" if len(self.names) > SHOWN else ""
        super().__init__(
            f"prepare() got a model whose weights were never loaded: {len(self.names)} of the {total} parameters "
            f"and buffers of {model_name} are on the meta device and no offload hook holds their values "
            f"({shown}{more}). A model built under init_empty_weights() has shapes but no values. Load its "
            "weights before prepare(): load_checkpoint_and_dispatch(model, checkpoint, device_map=...) or "
            "load_checkpoint_in_model(model, checkpoint); or, to train from fresh weights, call "
            "model.to_empty(device=...) and then initialise them (for example each module's reset_parameters())."
        )

    def __reduce__(self) -> tuple[type, tuple[str, list[str], int]]:  # picklable across processes
        return (type(self), (self.model_name, self.names, self.total))


def unloaded_weights(model: torch.nn.Module) -> tuple[list[str], int]:
    """Names of ``model``'s parameters and buffers on ``meta`` that no offload hook holds, and how many
    parameters and buffers it has.

    Args:
        model: the model to inspect (nothing is read from an offload folder).
    """
    tensors = list(itertools.chain(model.named_parameters(), model.named_buffers()))
    on_meta = [name for name, tensor in tensors if tensor.device.type == "meta"]
    if not on_meta:
        return [], len(tensors)
    modules = dict(model.named_modules())
    return [name for name in on_meta if offload_holder(modules, name) is None], len(tensors)
