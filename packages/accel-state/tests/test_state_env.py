"""Environment reading, the env-var protocol and launcher detection (pure, in-process)."""

from __future__ import annotations

import os

import pytest

from accel_state import cluster, env_vars
from accel_state.environment import (
    clear_environment,
    get_int_from_env,
    parse_flag_from_env,
    patch_environment,
    str_to_bool,
)


@pytest.mark.parametrize("text", ["1", "true", "YES", "on", "t", "y"])
def test_str_to_bool_true(text: str) -> None:
    assert str_to_bool(text) == 1
    assert str_to_bool(text, to_bool=True) is True


@pytest.mark.parametrize("text", ["0", "false", "No", "off", "f", "n"])
def test_str_to_bool_false(text: str) -> None:
    assert str_to_bool(text) == 0


def test_str_to_bool_rejects_other_words_and_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="invalid truth value 'maybe'.*'yes'"):
        str_to_bool("maybe")


def test_parse_flag_and_int_from_env() -> None:
    with patch_environment(my_flag="yes", my_int="7"):
        assert parse_flag_from_env("MY_FLAG") is True
        assert get_int_from_env(["MISSING", "MY_INT"], 3) == 7
    assert parse_flag_from_env("MY_FLAG", default=False) is False
    assert get_int_from_env(["MY_INT"], 3) == 3
    with patch_environment(my_int="seven"), pytest.raises(ValueError, match="MY_INT='seven' must be an integer"):
        get_int_from_env(["MY_INT"], 0)


def test_patch_environment_restores_previous_values_even_on_error() -> None:
    os.environ["ACCEL_TEST_KEEP"] = "before"
    with pytest.raises(RuntimeError), patch_environment(accel_test_keep="during", accel_test_new=1):
        assert os.environ["ACCEL_TEST_KEEP"] == "during"
        assert os.environ["ACCEL_TEST_NEW"] == "1"
        raise RuntimeError
    assert os.environ["ACCEL_TEST_KEEP"] == "before"
    assert "ACCEL_TEST_NEW" not in os.environ
    del os.environ["ACCEL_TEST_KEEP"]


def test_clear_environment_empties_then_restores() -> None:
    before = dict(os.environ)
    with clear_environment():
        assert dict(os.environ) == {}
        os.environ["ONLY_INSIDE"] = "1"
    assert dict(os.environ) == before


def test_env_var_protocol_reads_typed_values_and_defaults() -> None:
    env = {
        "ACCELERATE_USE_CPU": "true",
        "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "4",
        "FSDP_TRANSFORMER_CLS_TO_WRAP": "Block, Layer",
    }
    assert env_vars.read("ACCELERATE_USE_CPU", env) is True
    assert env_vars.read("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", env) == 4
    assert env_vars.read("FSDP_TRANSFORMER_CLS_TO_WRAP", env) == ["Block", "Layer"]
    assert env_vars.read("ACCELERATE_MIXED_PRECISION", env) == "no"


def test_env_var_protocol_round_trips_through_encode() -> None:
    values = {
        "ACCELERATE_USE_FSDP": True,
        "FSDP_MIN_NUM_PARAMS": 100,
        "FSDP_TRANSFORMER_CLS_TO_WRAP": ["A", "B"],
        "ACCELERATE_LOG_LEVEL": None,
    }
    encoded = env_vars.encode(values)
    assert encoded == {
        "ACCELERATE_USE_FSDP": "true",
        "FSDP_MIN_NUM_PARAMS": "100",
        "FSDP_TRANSFORMER_CLS_TO_WRAP": "A,B",
    }
    assert all(env_vars.read(name, encoded) == value for name, value in values.items() if value is not None)


def test_unknown_env_var_names_close_matches() -> None:
    with pytest.raises(
        KeyError,
        match="ACCELERATE_MIXED_PRECISON is not an accel environment variable; did you mean ACCELERATE_MIXED_PRECISION",
    ):
        env_vars.read("ACCELERATE_MIXED_PRECISON", {})


def test_env_var_with_bad_value_names_it() -> None:
    with pytest.raises(ValueError, match="FSDP_MIN_NUM_PARAMS='lots' must be an integer"):
        env_vars.read("FSDP_MIN_NUM_PARAMS", {"FSDP_MIN_NUM_PARAMS": "lots"})


def test_every_protocol_variable_is_documented_with_a_known_type() -> None:
    assert len(env_vars.ENV_VARS) > 50
    for var in env_vars.ENV_VARS.values():
        assert var.help and var.type in ("bool", "int", "float", "str", "list")
        prefix = var.name.split("_")[0]
        assert prefix in ("ACCELERATE", "FSDP", "MEGATRON", "PARALLELISM"), var.name


def test_detect_single_process_without_launcher() -> None:
    proc = cluster.detect({})
    assert (proc.rank, proc.world_size, proc.source, proc.is_distributed) == (0, 1, "single", False)


def test_detect_torchrun_variables() -> None:
    env = {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "1234",
    }
    proc = cluster.detect(env)
    assert (proc.rank, proc.world_size, proc.local_rank, proc.local_world_size) == (3, 4, 1, 2)
    assert (proc.master_addr, proc.master_port, proc.source) == ("10.0.0.1", 1234, "torch")
    assert proc.torch_variables()["RANK"] == "3"


def test_detect_open_mpi_and_mpich() -> None:
    ompi = cluster.detect(
        {
            "OMPI_COMM_WORLD_SIZE": "2",
            "OMPI_COMM_WORLD_RANK": "1",
            "OMPI_COMM_WORLD_LOCAL_RANK": "1",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        }
    )
    assert (ompi.rank, ompi.world_size, ompi.local_rank, ompi.source) == (1, 2, 1, "mpi")
    mpich = cluster.detect({"PMI_SIZE": "4", "PMI_RANK": "2", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "1"})
    assert (mpich.rank, mpich.world_size, mpich.local_world_size) == (2, 4, 1)


def test_detect_slurm_and_its_master_host() -> None:
    env = {
        "SLURM_NTASKS": "4",
        "SLURM_PROCID": "3",
        "SLURM_LOCALID": "1",
        "SLURM_NNODES": "2",
        "SLURM_JOB_NODELIST": "gpu[07-08]",
    }
    proc = cluster.detect(env)
    assert (proc.rank, proc.world_size, proc.local_rank, proc.local_world_size, proc.source) == (3, 4, 1, 2, "slurm")
    assert proc.master_addr == "gpu07"
    assert cluster.first_slurm_host("node1,node2") == "node1"
    assert cluster.first_slurm_host("a[3,5-7]") == "a3"


def test_torchrun_variables_win_over_slurm() -> None:
    env = {"SLURM_NTASKS": "8", "SLURM_PROCID": "5", "RANK": "0", "WORLD_SIZE": "2"}
    assert cluster.detect(env).source == "torch"


def test_inconsistent_launcher_variables_are_named() -> None:
    with pytest.raises(ValueError, match="rank 5 is outside the world of 2 processes"):
        cluster.detect({"RANK": "5", "WORLD_SIZE": "2"})
    with pytest.raises(ValueError, match="WORLD_SIZE='two' must be an integer"):
        cluster.detect({"RANK": "0", "WORLD_SIZE": "two"})
