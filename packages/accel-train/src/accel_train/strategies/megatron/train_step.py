"""Train steps: how a batch becomes megatron-core model inputs, and the model's output a loss.

A train step gives megatron-core's ``forward_backward_func`` its ``forward_step_func(data_iterator,
model) -> (output_tensor, loss_func)``. :class:`GPTTrainStep`, :class:`BertTrainStep` and
:class:`T5TrainStep` take Hugging Face style batches (``input_ids``, ``attention_mask``, ``labels``).
A custom step subclasses one of them (``MegatronLMPlugin.custom_train_step_class``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

__all__ = ["AbstractTrainStep", "BertTrainStep", "GPTTrainStep", "T5TrainStep"]


class AbstractTrainStep:
    """The three functions of a train step; subclasses fill them in.

    Args:
        name: the step's name (for messages).
    """

    def __init__(self, name: str) -> None:
        self.name = name

    def get_batch_func(self) -> Callable[[Iterator[Any]], Any]:
        """``get_batch(data_iterator)`` -> the model inputs of one micro-batch."""
        raise NotImplementedError(f"{type(self).__name__}.get_batch_func")

    def get_forward_step_func(self) -> Callable[[Iterator[Any], Any], Any]:
        """``forward_step(data_iterator, model)`` -> ``(output_tensor, loss_func)``."""
        raise NotImplementedError(f"{type(self).__name__}.get_forward_step_func")

    def get_loss_func(self) -> Callable[..., Any]:
        """``loss_func(..., output_tensor)`` -> ``(loss, {"lm loss": averaged loss})``."""
        raise NotImplementedError(f"{type(self).__name__}.get_loss_func")


def _attention_mask(query_padding: Any, key_padding: Any) -> Any:
    """megatron-core's ``[batch, 1, queries, keys]`` mask from two padding masks (True: not attended)."""
    both = query_padding[:, None, :, None].float() * key_padding[:, None, None, :].float()
    return both < 0.5


def _masked_mean(losses: Any, loss_mask: Any) -> Any:
    mask = loss_mask.reshape(-1).float()
    return (losses.float().reshape(-1) * mask).sum() / mask.sum().clamp(min=1.0)


class GPTTrainStep(AbstractTrainStep):
    """Causal language modelling on megatron-core's ``GPTModel``.

    Args:
        megatron_args: the run's settings (a namespace with ``eod_mask_loss``, ``eod_token`` ...; may be
            the plugin).
        **kwargs: Accepted for compatibility with other train steps; unused.
    """

    def __init__(self, megatron_args: Any = None, **kwargs: Any) -> None:
        super().__init__("GPTTrainStep")
        self.args = megatron_args
        self.eod_mask_loss = bool(getattr(megatron_args, "eod_mask_loss", False))
        self.eod_token = getattr(megatron_args, "eod_token", None)
        self.get_batch = self.get_batch_func()
        self.loss_func = self.get_loss_func()
        self.forward_step = self.get_forward_step_func()

    def get_batch_func(self) -> Callable[[Iterator[Any]], Any]:
        """``get_batch(data_iterator)``: the model inputs of one micro-batch."""

        def get_batch(data_iterator: Iterator[Any]) -> tuple[Any, Any, Any, Any, Any]:
            import torch

            batch = next(data_iterator)
            tokens = batch["input_ids"]
            labels = batch.get("labels")
            if labels is None:  # shift: predict the next token
                labels = torch.roll(tokens, -1, dims=1)
                loss_mask = torch.ones_like(tokens, dtype=torch.float)
                loss_mask[:, -1] = 0
            else:
                loss_mask = (labels != -100).float()
                labels = labels.clamp(min=0)
            if "attention_mask" in batch:
                loss_mask = loss_mask * batch["attention_mask"].float()
            if self.eod_mask_loss and self.eod_token is not None:
                loss_mask = loss_mask * (tokens != self.eod_token).float()
            position_ids = torch.arange(tokens.shape[1], device=tokens.device).unsqueeze(0).expand_as(tokens)
            return tokens, labels, loss_mask, None, position_ids

        return get_batch

    def get_loss_func(self) -> Callable[..., Any]:
        """``loss_func(loss_mask, output_tensor)``: the masked mean loss and ``{"lm loss": averaged loss}``."""

        def loss_func(loss_mask: Any, output_tensor: Any) -> tuple[Any, dict[str, Any]]:
            from accel_train.strategies.megatron.utils import avg_losses_across_data_parallel_group

            loss = _masked_mean(output_tensor, loss_mask)
            return loss, {"lm loss": avg_losses_across_data_parallel_group([loss])[0]}

        return loss_func

    def get_forward_step_func(self) -> Callable[[Iterator[Any], Any], Any]:
        """``forward_step(data_iterator, model)``: ``(output_tensor, loss_func)`` of one micro-batch."""

        def forward_step(data_iterator: Iterator[Any], model: Any) -> tuple[Any, Any]:
            tokens, labels, loss_mask, attention_mask, position_ids = self.get_batch(data_iterator)
            output = model(tokens, position_ids, attention_mask, labels=labels)
            return output, partial(self.loss_func, loss_mask)

        return forward_step


class BertTrainStep(AbstractTrainStep):
    """Masked language modelling on megatron-core's ``BertModel`` (labels -100 where not masked).

    Args:
        megatron_args: The run's settings (a namespace, or the plugin). Defaults to `None`.
        **kwargs: Accepted for compatibility with other train steps; unused.
    """

    def __init__(self, megatron_args: Any = None, **kwargs: Any) -> None:
        super().__init__("BertTrainStep")
        self.args = megatron_args
        self.get_batch = self.get_batch_func()
        self.loss_func = self.get_loss_func()
        self.forward_step = self.get_forward_step_func()

    def get_batch_func(self) -> Callable[[Iterator[Any]], Any]:
        """``get_batch(data_iterator)``: the model inputs of one micro-batch."""

        def get_batch(data_iterator: Iterator[Any]) -> tuple[Any, Any, Any, Any, Any]:
            batch = next(data_iterator)
            tokens = batch["input_ids"]
            labels = batch["labels"]
            loss_mask = (labels != -100).float()
            padding_mask = batch.get("attention_mask")
            types = batch.get("token_type_ids")
            return tokens, types, labels.clamp(min=0), loss_mask, padding_mask

        return get_batch

    def get_loss_func(self) -> Callable[..., Any]:
        """``loss_func(loss_mask, output_tensor)``: the masked mean loss and ``{"lm loss": averaged loss}``."""

        def loss_func(loss_mask: Any, output_tensor: Any) -> tuple[Any, dict[str, Any]]:
            from accel_train.strategies.megatron.utils import avg_losses_across_data_parallel_group

            lm_loss = output_tensor[0] if isinstance(output_tensor, tuple) else output_tensor
            loss = _masked_mean(lm_loss, loss_mask)
            return loss, {"lm loss": avg_losses_across_data_parallel_group([loss])[0]}

        return loss_func

    def get_forward_step_func(self) -> Callable[[Iterator[Any], Any], Any]:
        """``forward_step(data_iterator, model)``: ``(output_tensor, loss_func)`` of one micro-batch."""

        def forward_step(data_iterator: Iterator[Any], model: Any) -> tuple[Any, Any]:
            tokens, types, labels, loss_mask, padding_mask = self.get_batch(data_iterator)
            output = model(tokens, padding_mask, tokentype_ids=types, lm_labels=labels)
            return output, partial(self.loss_func, loss_mask)

        return forward_step


class T5TrainStep(AbstractTrainStep):
    """Sequence-to-sequence training on megatron-core's ``T5Model``.

    Args:
        megatron_args: The run's settings (a namespace, or the plugin). Defaults to `None`.
        **kwargs: Accepted for compatibility with other train steps; unused.
    """

    def __init__(self, megatron_args: Any = None, **kwargs: Any) -> None:
        super().__init__("T5TrainStep")
        self.args = megatron_args
        self.get_batch = self.get_batch_func()
        self.loss_func = self.get_loss_func()
        self.forward_step = self.get_forward_step_func()

    def get_batch_func(self) -> Callable[[Iterator[Any]], Any]:
        """``get_batch(data_iterator)``: the model inputs of one micro-batch."""

        def get_batch(data_iterator: Iterator[Any]) -> tuple[Any, ...]:
            import torch

            batch = next(data_iterator)
            tokens_enc = batch["input_ids"]
            labels = batch["labels"]
            loss_mask = (labels != -100).float()
            tokens_dec = batch.get("decoder_input_ids")
            if tokens_dec is None:  # shift right, starting from token 0 (T5's decoder start)
                tokens_dec = labels.clamp(min=0).roll(1, dims=1)
                tokens_dec[:, 0] = 0
            enc_pad = batch.get("attention_mask", torch.ones_like(tokens_enc))
            dec_pad = batch.get("decoder_attention_mask", torch.ones_like(tokens_dec))
            causal = torch.tril(torch.ones(tokens_dec.shape[1], tokens_dec.shape[1], device=tokens_dec.device))
            enc_mask = _attention_mask(enc_pad, enc_pad)
            dec_mask = _attention_mask(dec_pad, dec_pad) | (causal[None, None] < 0.5)
            enc_dec_mask = _attention_mask(dec_pad, enc_pad)
            return tokens_enc, tokens_dec, labels.clamp(min=0), loss_mask, enc_mask, dec_mask, enc_dec_mask

        return get_batch

    def get_loss_func(self) -> Callable[..., Any]:
        """``loss_func(loss_mask, output_tensor)``: the masked mean loss and ``{"lm loss": averaged loss}``."""

        def loss_func(loss_mask: Any, output_tensor: Any) -> tuple[Any, dict[str, Any]]:
            from accel_train.strategies.megatron.utils import avg_losses_across_data_parallel_group

            loss = _masked_mean(output_tensor, loss_mask)
            return loss, {"lm loss": avg_losses_across_data_parallel_group([loss])[0]}

        return loss_func

    def get_forward_step_func(self) -> Callable[[Iterator[Any], Any], Any]:
        """``forward_step(data_iterator, model)``: ``(output_tensor, loss_func)`` of one micro-batch."""

        def forward_step(data_iterator: Iterator[Any], model: Any) -> tuple[Any, Any]:
            tokens_enc, tokens_dec, labels, loss_mask, enc_mask, dec_mask, enc_dec_mask = self.get_batch(data_iterator)
            output = model(tokens_enc, tokens_dec, enc_mask, dec_mask, enc_dec_mask, lm_labels=labels)
            return output, partial(self.loss_func, loss_mask)

        return forward_step
