"""Train steps: how a batch becomes megatron-core model inputs, and the model's output a loss.

A train step gives megatron-core's ``forward_backward_func`` its ``forward_step_func(data_iterator,
model) -> (output_tensor, loss_func)``. `GPTTrainStep`, `BertTrainStep` and
`T5TrainStep` take Hugging Face style batches (``input_ids``, ``attention_mask``, ``labels``).
All three share `HFTrainStep` (the set-up, the masked-mean loss, the forward step); each says
how its batch becomes inputs and how its model is called. A custom step subclasses one of them
(``MegatronLMPlugin.custom_train_step_class``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, ClassVar

__all__ = ["AbstractTrainStep", "BertTrainStep", "GPTTrainStep", "HFTrainStep", "T5TrainStep"]


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


def _labels_and_loss_mask(labels: Any) -> tuple[Any, Any]:
    """Labels with the ignored positions (-100) set to 0, and the loss mask (1.0 where a label counts)."""
    return labels.clamp(min=0), (labels != -100).float()


class HFTrainStep(AbstractTrainStep):
    """What the GPT, BERT and T5 steps share: Hugging Face style batches in, a masked-mean loss out.

    The constructor builds the three functions once (``get_batch``, ``loss_func``, ``forward_step``).
    ``forward_step`` reads one micro-batch with ``get_batch``, calls the model through
    `call_model()` and binds the batch's loss mask to ``loss_func``; ``loss_func`` averages the
    model's per-token losses over the mask and logs ``{"lm loss": averaged over data parallel}``.
    A subclass sets `step_name` and defines ``get_batch_func`` and `call_model()`.

    Args:
        megatron_args: The run's settings (a namespace, or the plugin). Defaults to `None`.
        **kwargs: Accepted for compatibility with other train steps; unused.
    """

    #: the name the step reports (kept by subclasses, as a custom step is a kind of its base step)
    step_name: ClassVar[str] = "HFTrainStep"

    def __init__(self, megatron_args: Any = None, **kwargs: Any) -> None:
        super().__init__(self.step_name)
        self.args = megatron_args
        self.get_batch = self.get_batch_func()
        self.loss_func = self.get_loss_func()
        self.forward_step = self.get_forward_step_func()

    def call_model(self, model: Any, batch: tuple[Any, ...]) -> tuple[Any, Any]:
        """Run ``model`` on the inputs ``get_batch`` made.

        Args:
            model: the megatron-core model (chunk) of this stage.
            batch: what ``get_batch`` returned for one micro-batch.

        Returns:
            ``(output_tensor, loss_mask)``.
        """
        raise NotImplementedError(f"{type(self).__name__}.call_model")

    def token_losses(self, output_tensor: Any) -> Any:
        """The per-token losses in the model's output (the output itself unless a step says otherwise).

        Args:
            output_tensor: what the model returned.

        Returns:
            The tensor of per-token losses.
        """
        return output_tensor

    def get_loss_func(self) -> Callable[..., Any]:
        """``loss_func(loss_mask, output_tensor)``: the masked mean loss and ``{"lm loss": averaged loss}``."""

        def loss_func(loss_mask: Any, output_tensor: Any) -> tuple[Any, dict[str, Any]]:
            from accel_train.strategies.megatron.utils import avg_losses_across_data_parallel_group

            loss = _masked_mean(self.token_losses(output_tensor), loss_mask)
            return loss, {"lm loss": avg_losses_across_data_parallel_group([loss])[0]}

        return loss_func

    def get_forward_step_func(self) -> Callable[[Iterator[Any], Any], Any]:
        """``forward_step(data_iterator, model)``: ``(output_tensor, loss_func)`` of one micro-batch."""

        def forward_step(data_iterator: Iterator[Any], model: Any) -> tuple[Any, Any]:
            output, loss_mask = self.call_model(model, self.get_batch(data_iterator))
            return output, partial(self.loss_func, loss_mask)

        return forward_step


class GPTTrainStep(HFTrainStep):
    """Causal language modelling on megatron-core's ``GPTModel``.

    Args:
        megatron_args: the run's settings (a namespace with ``eod_mask_loss``, ``eod_token`` ...; may be
            the plugin).
        **kwargs: Accepted for compatibility with other train steps; unused.
    """

    step_name = "GPTTrainStep"

    def __init__(self, megatron_args: Any = None, **kwargs: Any) -> None:
        self.eod_mask_loss = bool(getattr(megatron_args, "eod_mask_loss", False))
        self.eod_token = getattr(megatron_args, "eod_token", None)
        super().__init__(megatron_args, **kwargs)

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
                labels, loss_mask = _labels_and_loss_mask(labels)
            if "attention_mask" in batch:
                loss_mask = loss_mask * batch["attention_mask"].float()
            if self.eod_mask_loss and self.eod_token is not None:
                loss_mask = loss_mask * (tokens != self.eod_token).float()
            position_ids = torch.arange(tokens.shape[1], device=tokens.device).unsqueeze(0).expand_as(tokens)
            return tokens, labels, loss_mask, None, position_ids

        return get_batch

    def call_model(self, model: Any, batch: tuple[Any, ...]) -> tuple[Any, Any]:
        """``model(tokens, position_ids, attention_mask, labels=labels)``.

        Args:
            model: the ``GPTModel`` (chunk).
            batch: ``(tokens, labels, loss_mask, attention_mask, position_ids)``.

        Returns:
            ``(output_tensor, loss_mask)``.
        """
        tokens, labels, loss_mask, attention_mask, position_ids = batch
        return model(tokens, position_ids, attention_mask, labels=labels), loss_mask


class BertTrainStep(HFTrainStep):
    """Masked language modelling on megatron-core's ``BertModel`` (labels -100 where not masked).

    Args:
        megatron_args: The run's settings (a namespace, or the plugin). Defaults to `None`.
        **kwargs: Accepted for compatibility with other train steps; unused.
    """

    step_name = "BertTrainStep"

    def get_batch_func(self) -> Callable[[Iterator[Any]], Any]:
        """``get_batch(data_iterator)``: the model inputs of one micro-batch."""

        def get_batch(data_iterator: Iterator[Any]) -> tuple[Any, Any, Any, Any, Any]:
            batch = next(data_iterator)
            labels, loss_mask = _labels_and_loss_mask(batch["labels"])
            return batch["input_ids"], batch.get("token_type_ids"), labels, loss_mask, batch.get("attention_mask")

        return get_batch

    def call_model(self, model: Any, batch: tuple[Any, ...]) -> tuple[Any, Any]:
        """``model(tokens, padding_mask, tokentype_ids=types, lm_labels=labels)``.

        Args:
            model: the ``BertModel`` (chunk).
            batch: ``(tokens, types, labels, loss_mask, padding_mask)``.

        Returns:
            ``(output_tensor, loss_mask)``.
        """
        tokens, types, labels, loss_mask, padding_mask = batch
        return model(tokens, padding_mask, tokentype_ids=types, lm_labels=labels), loss_mask

    def token_losses(self, output_tensor: Any) -> Any:
        """The LM losses: the first output when the model also returns its binary head's.

        Args:
            output_tensor: the model's output, a tensor or ``(lm_loss, binary_logits)``.

        Returns:
            The per-token LM losses.
        """
        return output_tensor[0] if isinstance(output_tensor, tuple) else output_tensor


class T5TrainStep(HFTrainStep):
    """Sequence-to-sequence training on megatron-core's ``T5Model``.

    Args:
        megatron_args: The run's settings (a namespace, or the plugin). Defaults to `None`.
        **kwargs: Accepted for compatibility with other train steps; unused.
    """

    step_name = "T5TrainStep"

    def get_batch_func(self) -> Callable[[Iterator[Any]], Any]:
        """``get_batch(data_iterator)``: the model inputs of one micro-batch."""

        def get_batch(data_iterator: Iterator[Any]) -> tuple[Any, ...]:
            import torch

            batch = next(data_iterator)
            tokens_enc = batch["input_ids"]
            labels, loss_mask = _labels_and_loss_mask(batch["labels"])
            tokens_dec = batch.get("decoder_input_ids")
            if tokens_dec is None:  # shift right, starting from token 0 (T5's decoder start)
                tokens_dec = labels.roll(1, dims=1)
                tokens_dec[:, 0] = 0
            enc_pad = batch.get("attention_mask", torch.ones_like(tokens_enc))
            dec_pad = batch.get("decoder_attention_mask", torch.ones_like(tokens_dec))
            causal = torch.tril(torch.ones(tokens_dec.shape[1], tokens_dec.shape[1], device=tokens_dec.device))
            enc_mask = _attention_mask(enc_pad, enc_pad)
            dec_mask = _attention_mask(dec_pad, dec_pad) | (causal[None, None] < 0.5)
            enc_dec_mask = _attention_mask(dec_pad, enc_pad)
            return tokens_enc, tokens_dec, labels, loss_mask, enc_mask, dec_mask, enc_dec_mask

        return get_batch

    def call_model(self, model: Any, batch: tuple[Any, ...]) -> tuple[Any, Any]:
        """``model(tokens_enc, tokens_dec, enc_mask, dec_mask, enc_dec_mask, lm_labels=labels)``.

        Args:
            model: the ``T5Model`` (chunk).
            batch: ``(tokens_enc, tokens_dec, labels, loss_mask, enc_mask, dec_mask, enc_dec_mask)``.

        Returns:
            ``(output_tensor, loss_mask)``.
        """
        tokens_enc, tokens_dec, labels, loss_mask, enc_mask, dec_mask, enc_dec_mask = batch
        return model(tokens_enc, tokens_dec, enc_mask, dec_mask, enc_dec_mask, lm_labels=labels), loss_mask
