"""What a scheduler tells ``accel launch`` (Kubernetes PET_*, SLURM_*, plain MASTER_ADDR), and the
SLURM requeue command: pure functions over a mapping."""

from __future__ import annotations

import pytest

from accel_state.cluster import detect, launch_topology, requeue_command


def test_pytorchjob_pet_variables() -> None:
    env = {
        "PET_NNODES": "3",
        "PET_NODE_RANK": "2",
        "PET_NPROC_PER_NODE": "4",
        "PET_MASTER_ADDR": "job-master-0",
        "PET_MASTER_PORT": "23456",
        "MASTER_ADDR": "ignored",
    }
    topology = launch_topology(env)
    assert topology is not None and topology.scheduler == "kubernetes"
    assert (topology.num_machines, topology.machine_rank, topology.nproc_per_machine) == (3, 2, 4)
    assert (topology.main_process_ip, topology.main_process_port) == ("job-master-0", 23456)
    assert topology.sources["main_process_ip"] == "PET_MASTER_ADDR"


def test_pet_falls_back_to_plain_master_variables_and_reads_elastic_ranges() -> None:
    topology = launch_topology({"PET_NNODES": "1:2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234"})
    assert topology.num_machines == 2 and topology.main_process_ip == "10.0.0.1" and topology.main_process_port == 1234
    assert topology.sources["main_process_port"] == "MASTER_PORT"
    assert launch_topology({"PET_NNODES": "2", "PET_NPROC_PER_NODE": "auto"}).nproc_per_machine is None


def test_slurm_allocation() -> None:
    env = {"SLURM_JOB_ID": "77", "SLURM_NNODES": "4", "SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "gpu[07-10]"}
    topology = launch_topology(env)
    assert topology.scheduler == "slurm" and topology.job_id == "77"
    assert (topology.num_machines, topology.machine_rank, topology.main_process_ip) == (4, 1, "gpu07")
    assert topology.main_process_port is None and topology.nproc_per_machine is None


def test_plain_master_addr_is_only_a_fallback_and_nothing_is_none() -> None:
    topology = launch_topology({"MASTER_ADDR": "h", "MASTER_PORT": "5"})
    assert topology.fallback and topology.main_process_ip == "h" and topology.num_machines is None
    assert launch_topology({}) is None
    with pytest.raises(ValueError, match="PET_NODE_RANK"):
        launch_topology({"PET_NNODES": "2", "PET_NODE_RANK": "one"})


def test_requeue_command() -> None:
    assert requeue_command({"SLURM_JOB_ID": "9"}) == ["scontrol", "requeue", "9"]
    assert requeue_command({"SLURM_JOB_ID": "9", "SLURM_ARRAY_JOB_ID": "8", "SLURM_ARRAY_TASK_ID": "3"}) == [
        "scontrol",
        "requeue",
        "8_3",
    ]
    assert requeue_command({}) is None


def test_srun_variables_describe_the_process() -> None:
    env = {"SLURM_NTASKS": "4", "SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NNODES": "2"}
    env["SLURM_JOB_NODELIST"] = "n[1-2]"
    proc = detect(env)
    assert (proc.rank, proc.world_size, proc.local_rank, proc.local_world_size, proc.master_addr) == (3, 4, 1, 2, "n1")
