"""Settings of a config file reach the processes that ``accel launch`` starts: each rank's plugin holds
every value the file set (FSDP, DeepSpeed, FP8 and parallelism sections, spelled as the documented
system writes them)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from conftest import accel_command, run_command

# Each rank writes what its plugins hold (built exactly as a script would build them).
_SCRIPT = textwrap.dedent(
    """
    import dataclasses, json, os, sys
    from accel_state.state import PartialState

    what = sys.argv[1]
    state = PartialState()
    out = {"rank": state.process_index}
    if what == "fsdp":
        from accel_train import Accelerator
        accelerator = Accelerator()
        out["distributed_type"] = accelerator.distributed_type.value
        plugin = accelerator.state.fsdp_plugin
        import enum
        from accel_train.strategies.fsdp.plugin import setting_name
        def plain(value):  # the plugin holds torch's types; compare by their documented names
            if isinstance(value, enum.Enum):
                return setting_name(value)
            return bool(value.offload_params) if hasattr(value, "offload_params") else value
        out.update({f.name: plain(getattr(plugin, f.name)) for f in dataclasses.fields(plugin)
                    if isinstance(plain(getattr(plugin, f.name)), (str, int, bool, list, type(None)))})
    elif what == "deepspeed":
        from accel_train.deepspeed_plugin import DeepSpeedPlugin
        plugin = DeepSpeedPlugin()
        out.update({f.name: getattr(plugin, f.name) for f in dataclasses.fields(plugin)
                    if isinstance(getattr(plugin, f.name), (str, int, float, bool, list, type(None)))})
        out["use_deepspeed"] = os.environ.get("ACCELERATE_USE_DEEPSPEED")
    elif what == "fp8":
        from accel_train.kwargs_handlers import AORecipeKwargs, FP8RecipeKwargs, MSAMPRecipeKwargs, TERecipeKwargs
        te, msamp, ao, umbrella = TERecipeKwargs(), MSAMPRecipeKwargs(), AORecipeKwargs(), FP8RecipeKwargs()
        out["te"] = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(te).items()}
        out["opt_level"] = msamp.opt_level
        out["ao"] = {"pad_inner_dim": ao.pad_inner_dim, "all_gather": ao.enable_fsdp_float8_all_gather}
        out["backend"] = umbrella.backend
        out["mixed_precision"] = os.environ.get("ACCELERATE_MIXED_PRECISION")
    elif what == "parallelism":
        from accel_train import Accelerator
        accelerator = Accelerator()
        config = accelerator.parallelism_config
        out.update(dp_replicate=config.dp_replicate_size, dp_shard=config.dp_shard_size, tp=config.tp_size,
                   cp=config.cp_size, cp_comm=config.cp_handler.cp_comm_strategy if config.cp_handler else None,
                   total=config.total_size)
    with open(os.path.join(sys.argv[2], f"rank{state.process_index}.json"), "w") as f:
        json.dump(out, f)
    """
)

_HEAD = "compute_environment: LOCAL_MACHINE\nuse_cpu: true\nnum_processes: 2\nmachine_rank: 0\nnum_machines: 1\n"

_CONFIGS = {
    "fsdp": _HEAD
    + textwrap.dedent(
        """
        distributed_type: FSDP
        mixed_precision: 'no'
        fsdp_config:
          fsdp_version: 1
          fsdp_sharding_strategy: SHARD_GRAD_OP
          fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
          fsdp_transformer_layer_cls_to_wrap: Block,Layer
          fsdp_state_dict_type: SHARDED_STATE_DICT
          fsdp_backward_prefetch: BACKWARD_POST
          fsdp_forward_prefetch: true
          fsdp_use_orig_params: false
          fsdp_sync_module_states: true
          fsdp_cpu_ram_efficient_loading: true
          fsdp_offload_params: true
          fsdp_activation_checkpointing: true
          fsdp_min_num_params: 1000
        """
    ),
    "deepspeed": _HEAD
    + textwrap.dedent(
        """
        distributed_type: DEEPSPEED
        mixed_precision: 'no'
        deepspeed_config:
          zero_stage: 3
          offload_optimizer_device: cpu
          offload_param_device: cpu
          gradient_accumulation_steps: 4
          gradient_clipping: 0.7
          zero3_init_flag: true
          zero3_save_16bit_model: true
        """
    ),
    "fp8": _HEAD
    + textwrap.dedent(
        """
        distributed_type: MULTI_CPU
        mixed_precision: fp8
        fp8_config:
          amax_compute_algorithm: max
          amax_history_length: 16
          backend: TE
          fp8_format: E4M3
          interval: 3
          margin: 2
          override_linear_precision: false
          use_autocast_during_eval: true
          optimization_level: O1
          pad_inner_dim: false
        """
    ),
    "parallelism": _HEAD
    + textwrap.dedent(
        """
        distributed_type: MULTI_CPU
        mixed_precision: 'no'
        parallelism_config:
          parallelism_config_dp_shard_size: 2
          parallelism_config_cp_comm_strategy: alltoall
        """
    ),
}

_EXPECTED = {
    "fsdp": {
        "distributed_type": "FSDP",
        "fsdp_version": 1,
        "sharding_strategy": "SHARD_GRAD_OP",
        "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "transformer_cls_names_to_wrap": ["Block", "Layer"],
        "state_dict_type": "SHARDED_STATE_DICT",
        "backward_prefetch": "BACKWARD_POST",
        "forward_prefetch": True,
        "use_orig_params": False,
        "sync_module_states": True,
        "cpu_ram_efficient_loading": True,
        "cpu_offload": True,
        "activation_checkpointing": True,
        "min_num_params": 1000,
    },
    "deepspeed": {
        "use_deepspeed": "true",
        "zero_stage": 3,
        "offload_optimizer_device": "cpu",
        "offload_param_device": "cpu",
        "gradient_accumulation_steps": 4,
        "gradient_clipping": 0.7,
        "zero3_init_flag": True,
        "zero3_save_16bit_model": True,
    },
    "fp8": {
        "mixed_precision": "fp8",
        "backend": "TE",
        "opt_level": "O1",
        "ao": {"pad_inner_dim": False, "all_gather": True},
        "te": {
            "use_autocast_during_eval": True,
            "margin": 2,
            "interval": 3,
            "fp8_format": "E4M3",
            "amax_history_len": 16,
            "amax_compute_algo": "max",
            "override_linear_precision": [False, False, False],
            "use_mxfp8_block_scaling": False,
        },
    },
    "parallelism": {"dp_replicate": 1, "dp_shard": 2, "tp": 1, "cp": 1, "cp_comm": None, "total": 2},
}


@pytest.mark.parametrize("section", sorted(_CONFIGS))
def test_every_rank_holds_what_the_config_file_set(tmp_path: Path, section: str) -> None:
    script = tmp_path / "dump.py"
    script.write_text(_SCRIPT)
    config = tmp_path / f"{section}.yaml"
    config.write_text(_CONFIGS[section])
    out = tmp_path / "out"
    out.mkdir()
    result = run_command(
        [*accel_command(), "launch", "--config_file", str(config), str(script), section, str(out)], timeout=300
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ranks = [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for rank, seen in enumerate(ranks):
        assert seen["rank"] == rank
        for key, value in _EXPECTED[section].items():
            assert seen[key] == value, f"rank {rank}: {key} is {seen[key]!r}, the file set {value!r}"
