"""Megatron-LM: the plugin and its translation into megatron-core's settings, the documented helpers,
megatron-core's parallel state over real gloo processes, the named errors on a machine without CUDA,
and (on a GPU) a tiny GPT trained against the same model in plain PyTorch."""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch

from accel_state.testing import DistributedPool, reset_shared_state
from accel_train.parallel_plugins import BackendNotAvailableError
from accel_train.strategies.megatron import (
    GPTTrainStep,
    MegatronLMDummyDataLoader,
    MegatronLMDummyScheduler,
    MegatronLMPlugin,
)
from accel_train.strategies.megatron import config as translate

_GPT2 = types.SimpleNamespace(
    model_type="gpt2", n_layer=4, n_embd=32, n_head=4, n_inner=None, vocab_size=64, n_positions=16
)


def test_the_old_module_path_still_gives_the_plugin() -> None:
    from accel_train.megatron_plugin import MegatronLMPlugin as Old

    assert Old is MegatronLMPlugin


def test_launcher_only_settings_reach_other_megatron_args(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEGATRON_LM_RECOMPUTE_GRANULARITY", "full")
    monkeypatch.setenv("MEGATRON_LM_HIDDEN_DROPOUT", "0.2")
    monkeypatch.setenv("MEGATRON_LM_DECODER_LAST_PIPELINE_NUM_LAYERS", "3")
    plugin = MegatronLMPlugin(other_megatron_args={"hidden_dropout": 0.0})
    assert plugin.other_megatron_args == {
        "hidden_dropout": 0.0,  # the script's value wins
        "recompute_granularity": "full",
        "num_layers_in_last_pipeline_stage": 3,
    }
    with pytest.raises(TypeError, match="other_megatron_args must be a dict"):
        MegatronLMPlugin(other_megatron_args=[("a", 1)])
    with pytest.raises(ValueError, match="lr_decay_style='step' is not valid"):
        MegatronLMPlugin(lr_decay_style="step")


def test_global_batch_size_follows_micro_batches_and_data_parallel() -> None:
    plugin = MegatronLMPlugin(num_micro_batches=4)
    plugin.set_batch_sizes(micro_batch_size=2, data_parallel_size=3)
    assert (plugin.micro_batch_size, plugin.global_batch_size) == (2, 24)


def test_model_sizes_come_from_the_transformers_config() -> None:
    facts = translate.model_facts(_GPT2)
    assert (facts.family, facts.num_layers, facts.hidden_size, facts.ffn_hidden_size) == ("gpt", 4, 32, 128)
    assert translate.model_facts(types.SimpleNamespace(**(vars(_GPT2) | {"model_type": "bert"}))).family == "bert"
    assert translate.model_facts(_GPT2, {"num_layers": 2}).num_layers == 2
    with pytest.raises(ValueError, match=r"cannot read \['num_layers'.*other_megatron_args"):
        translate.model_facts(types.SimpleNamespace(model_type="gpt2"))


def test_plugin_translates_to_megatron_core_settings() -> None:
    plugin = MegatronLMPlugin(
        tp_degree=2,
        pp_degree=2,
        sequence_parallelism=True,
        recompute_activations=True,
        num_layers_per_virtual_pipeline_stage=1,
        gradient_clipping=0.5,
        use_distributed_optimizer=True,
    )
    facts = translate.model_facts(_GPT2)
    state = translate.parallel_state_kwargs(plugin, facts.num_layers)
    assert state["tensor_model_parallel_size"] == 2 and state["pipeline_model_parallel_size"] == 2
    assert state["virtual_pipeline_model_parallel_size"] == 2  # 4 layers / pp 2 / 1 per virtual stage
    config = translate.transformer_config_kwargs(plugin, facts, "bf16")
    assert config["sequence_parallel"] and config["recompute_granularity"] == "selective"
    assert config["params_dtype"] is torch.bfloat16 and config["bf16"]
    optimizer = torch.optim.AdamW(torch.nn.Linear(2, 2).parameters(), lr=3e-4, betas=(0.8, 0.95), weight_decay=0.1)
    opt = translate.optimizer_config_kwargs(plugin, optimizer, "bf16")
    assert (opt["optimizer"], opt["lr"], opt["adam_beta1"], opt["adam_beta2"]) == ("adam", 3e-4, 0.8, 0.95)
    assert opt["clip_grad"] == 0.5 and opt["use_distributed_optimizer"] and opt["weight_decay"] == 0.1
    with pytest.raises(ValueError, match="builds its own Adam or SGD optimizer; got Adagrad"):
        translate.optimizer_config_kwargs(plugin, torch.optim.Adagrad(torch.nn.Linear(2, 2).parameters()))
    with pytest.raises(ValueError, match="num_layers_per_virtual_pipeline_stage=3 must divide"):
        translate.parallel_state_kwargs(MegatronLMPlugin(pp_degree=2, num_layers_per_virtual_pipeline_stage=3), 4)


def test_dummy_scheduler_gives_the_schedule() -> None:
    optimizer = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    dummy = MegatronLMDummyScheduler(optimizer, total_num_steps=100, warmup_num_steps=10)
    kwargs = translate.scheduler_kwargs(MegatronLMPlugin(lr_decay_style="cosine"), dummy, 0.1, 0.0)
    assert (kwargs["max_lr"], kwargs["init_lr"], kwargs["lr_warmup_steps"], kwargs["lr_decay_steps"]) == (
        0.1,
        0.0,
        10,
        100,
    )
    assert kwargs["lr_decay_style"] == "cosine"
    plugin_wins = translate.scheduler_kwargs(
        MegatronLMPlugin(lr_decay_iters=50, lr_warmup_fraction=0.2), dummy, 0.1, 0.0
    )
    assert (plugin_wins["lr_decay_steps"], plugin_wins["lr_warmup_steps"]) == (50, 10)
    with pytest.raises(ValueError, match="needs a length.*total_num_steps"):
        translate.scheduler_kwargs(MegatronLMPlugin(), MegatronLMDummyScheduler(optimizer), 0.1, 0.0)
    with pytest.raises(ValueError, match="warmup_num_steps must be >= 0"):
        MegatronLMDummyScheduler(optimizer, warmup_num_steps=-1)


def test_prepare_sees_the_dummy_scheduler_as_a_scheduler() -> None:
    # prepare hands schedulers to the strategy; a stand-in it did not recognise came back unchanged,
    # and the GPU run then failed at scheduler.step() (seen on an H200)
    from accel_train.accelerator import _is_scheduler

    optimizer = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    dummy = MegatronLMDummyScheduler(optimizer, total_num_steps=10)
    assert _is_scheduler(dummy) and dummy.state_dict() == {}
    with pytest.raises(RuntimeError, match="pass it to `accelerator.prepare`"):
        dummy.step()


def test_dummy_data_loader_holds_the_dataset_settings() -> None:
    loader = MegatronLMDummyDataLoader(data_path=["corpus"], seq_length=128, micro_batch_size=4)
    assert loader.seq_length == 128 and loader.set_megatron_data_args()["data_path"] == ["corpus"]
    with pytest.raises(AttributeError):
        _ = loader.splits_string


def test_other_args_go_to_the_config_that_has_them() -> None:
    fields = {"transformer": ["hidden_dropout", "sequence_parallel"], "optimizer": ["adam_eps"], "ddp": ["bucket_size"]}
    routed = translate.route_other_args({"hidden_dropout": 0.0, "adam_eps": 1e-6, "vocab_file": "v.json"}, fields)
    assert routed == {"transformer": {"hidden_dropout": 0.0}, "optimizer": {"adam_eps": 1e-6}, "ddp": {}}
    with pytest.raises(ValueError, match=r"other_megatron_args has \['hiden_dropout'\], which no megatron-core"):
        translate.route_other_args({"hiden_dropout": 0.1}, fields)


def test_gpt_train_step_makes_shifted_labels_and_masks() -> None:
    step = GPTTrainStep(types.SimpleNamespace(eod_mask_loss=True, eod_token=0))
    batch = {"input_ids": torch.tensor([[5, 6, 0, 7]]), "attention_mask": torch.tensor([[1, 1, 1, 0]])}
    _tokens, labels, loss_mask, _, position_ids = step.get_batch(iter([batch]))
    assert labels.tolist() == [[6, 0, 7, 5]] and loss_mask.tolist() == [[1.0, 1.0, 0.0, 0.0]]
    assert position_ids.tolist() == [[0, 1, 2, 3]]
    loss, logged = step.loss_func(loss_mask, torch.tensor([[1.0, 3.0, 100.0, 100.0]]))
    assert loss.item() == 2.0 and logged["lm loss"].item() == 2.0


def test_the_real_megatron_core_configs_take_the_translation() -> None:
    pytest.importorskip("megatron.core")
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer import TransformerConfig

    plugin = MegatronLMPlugin(recompute_activations=True)
    facts = translate.model_facts(_GPT2)
    config = TransformerConfig(**translate.transformer_config_kwargs(plugin, facts, "no"))
    assert config.num_layers == 4 and config.ffn_hidden_size == 128 and config.recompute_granularity == "selective"
    optimizer = torch.optim.AdamW(torch.nn.Linear(2, 2).parameters(), lr=1e-3)
    assert OptimizerConfig(**translate.optimizer_config_kwargs(plugin, optimizer)).lr == 1e-3
    names = {f.name for f in dataclasses.fields(TransformerConfig)}
    assert set(translate.transformer_config_kwargs(plugin, facts, "bf16")) <= names


# -- on real processes ----------------------------------------------------------------------------------


def rank_parallel_state(pp: int) -> dict:
    reset_shared_state()
    from accel_train import Accelerator

    accelerator = Accelerator(megatron_lm_plugin=MegatronLMPlugin(pp_degree=pp))
    from megatron.core import parallel_state as ps

    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(8.0)), batch_size=2)
    loader = accelerator.prepare(loader)
    error = ""
    try:
        accelerator.prepare(torch.nn.Linear(2, 2))
    except BackendNotAvailableError as exc:
        error = f"{type(exc).__name__}: {exc}"
    return {
        "pp_rank": ps.get_pipeline_model_parallel_rank(),
        "dp_size": ps.get_data_parallel_world_size(),
        "accel_dp": accelerator.data_parallel_rank,
        "first": next(iter(loader))[0].tolist(),
        "error": error,
    }


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error given on a machine without CUDA")
def test_parallel_state_over_gloo_then_a_named_cuda_error(dist_pool: DistributedPool) -> None:
    pytest.importorskip("megatron.core")
    results = dist_pool.run(rank_parallel_state, 2)
    assert [r["pp_rank"] for r in results] == [0, 1] and all(r["dp_size"] == 1 for r in results)
    assert results[0]["first"] == results[1]["first"]  # pipeline peers read the same batches
    for result in results:
        assert result["error"].startswith("MegatronCUDARequiredError: Megatron-LM needs CUDA")
    dp = dist_pool.run(rank_parallel_state, 1)
    assert [r["dp_size"] for r in dp] == [2, 2] and [r["accel_dp"] for r in dp] == [0, 1]
    assert dp[0]["first"] != dp[1]["first"]


# -- on a GPU -------------------------------------------------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="megatron-core's layers need CUDA; this machine has none")
def test_tiny_gpt_trains_like_plain_pytorch() -> None:  # pragma: no cover - needs a GPU
    pytest.importorskip("megatron.core")
    from accel_train.test_utils.megatron_gpt import compare_with_plain_pytorch

    losses, reference = compare_with_plain_pytorch(steps=5)
    assert losses == pytest.approx(reference, rel=1e-3)


def test_bert_and_t5_train_steps_make_megatron_inputs() -> None:
    from accel_train.strategies.megatron import BertTrainStep, T5TrainStep

    bert = BertTrainStep(None)
    batch = {"input_ids": torch.tensor([[3, 4, 5]]), "labels": torch.tensor([[-100, 9, -100]])}
    _tokens, _types, labels, loss_mask, _padding = bert.get_batch(iter([batch]))
    assert labels.tolist() == [[0, 9, 0]] and loss_mask.tolist() == [[0.0, 1.0, 0.0]]
    t5 = T5TrainStep(None)
    batch = {
        "input_ids": torch.tensor([[3, 4, 0]]),
        "attention_mask": torch.tensor([[1, 1, 0]]),
        "labels": torch.tensor([[7, 8]]),
    }
    _enc, dec, labels, loss_mask, enc_mask, dec_mask, enc_dec_mask = t5.get_batch(iter([batch]))
    assert dec.tolist() == [[0, 7]] and labels.tolist() == [[7, 8]]
    assert enc_mask.shape == (1, 1, 3, 3) and enc_mask[0, 0, 0].tolist() == [False, False, True]
    assert dec_mask[0, 0].tolist() == [[False, True], [False, False]]  # causal
    assert enc_dec_mask.shape == (1, 1, 2, 3) and enc_dec_mask[0, 0, 1].tolist() == [False, False, True]


def test_each_train_step_calls_its_model_and_binds_the_loss_mask() -> None:
    from accel_train.strategies.megatron import BertTrainStep, T5TrainStep

    calls: list[tuple] = []

    def model(*args, **kwargs):
        calls.append((args, kwargs))
        return torch.tensor([[2.0, 4.0, 6.0]])

    labels = torch.tensor([[-100, 1, 2]])
    batch = {"input_ids": torch.tensor([[3, 4, 5]]), "labels": labels, "token_type_ids": torch.zeros(1, 3)}
    for cls in (GPTTrainStep, BertTrainStep, T5TrainStep):
        step = cls(None)
        assert step.name == cls.__name__
        output, loss_func = step.forward_step(iter([dict(batch)]), model)
        assert output.tolist() == [[2.0, 4.0, 6.0]]
        loss, logged = loss_func(output)
        assert loss.item() == 5.0 and logged["lm loss"].item() == 5.0  # position 0 masked out
    gpt_args, bert_args, t5_args = calls
    assert gpt_args[1]["labels"].tolist() == [[0, 1, 2]] and len(gpt_args[0]) == 3
    assert bert_args[1]["lm_labels"].tolist() == [[0, 1, 2]] and "tokentype_ids" in bert_args[1]
    assert t5_args[1]["lm_labels"].tolist() == [[0, 1, 2]] and len(t5_args[0]) == 5
    # BERT's model may return (lm loss, binary head): the loss is the first.
    loss, _ = BertTrainStep(None).loss_func(torch.tensor([[0.0, 1.0]]), (torch.tensor([[9.0, 3.0]]), None))
    assert loss.item() == 3.0


def test_a_custom_step_keeps_the_name_of_the_step_it_subclasses() -> None:
    class MyStep(GPTTrainStep):
        pass

    assert MyStep(None).name == "GPTTrainStep"


def test_missing_megatron_core_names_the_repository_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from accel_state.install_hints import install_hint
    from accel_train.strategies.megatron import strategy

    monkeypatch.setattr(strategy, "megatron_core_available", lambda: False)
    with pytest.raises(BackendNotAvailableError) as info:
        strategy.MegatronLMStrategy.require_backend()
    assert install_hint("accel-train", "megatron") in str(info.value)
    assert '"./packages/accel-train[megatron]"' in str(info.value)
