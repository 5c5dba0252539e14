"""The documented names of the ND device mesh and the rank properties, on 2 and 4 real gloo processes.

Every non-empty group is flattened whatever its length (``dp``, ``dp_shard_cp``, ``dp_cp``), so scripts
that index ``accelerator.torch_device_mesh["dp_cp"]`` work with one active data-parallel dimension too;
a model the user split with torch's ``parallelize_module`` is prepared as it is.
"""

from __future__ import annotations

import pytest
import torch

from accel_state.testing import DistributedPool, reset_shared_state
from accel_train.parallelism_config import ParallelismConfig

pytestmark = pytest.mark.filterwarnings("ignore:Slicing a flattened dim")


def rank_mesh_facts(sizes: dict) -> dict:
    reset_shared_state()
    from accel_train import Accelerator

    if sizes.get("cp_size", 1) > 1:
        # Context parallelism runs on CUDA only (the Accelerator refuses it on CPU): the config's mesh.
        import torch.distributed as dist

        from accel_state.state import PartialState

        PartialState(cpu=True)
        mesh = ParallelismConfig(**sizes).build_device_mesh("cpu")
        facts: dict = {"rank": dist.get_rank(), "ranks": (0, 0, 0, mesh["cp"].get_local_rank())}
        for name in ("dp", "dp_shard_cp", "dp_cp", "dp_replicate", "dp_shard", "cp", "tp"):
            try:
                facts[name] = (mesh[name].size(), mesh[name].get_local_rank())
            except KeyError:
                continue
        reset_shared_state()
        return facts
    accelerator = Accelerator(parallelism_config=ParallelismConfig(**sizes))
    mesh = accelerator.torch_device_mesh
    facts = {"rank": accelerator.process_index}
    for name in ("dp", "dp_shard_cp", "dp_cp", "dp_replicate", "dp_shard", "cp", "tp"):
        try:
            sub = mesh[name]
        except KeyError:
            continue
        facts[name] = (sub.size(), sub.get_local_rank())
    facts["ranks"] = (
        accelerator.data_parallel_rank,
        accelerator.data_parallel_shard_rank,
        accelerator.tensor_parallel_rank,
        accelerator.context_parallel_rank,
    )
    reset_shared_state()
    return facts


@pytest.mark.parametrize(
    ("sizes", "names"),
    [
        ({"dp_shard_size": 2}, {"dp", "dp_shard_cp", "dp_cp", "dp_shard"}),
        ({"dp_replicate_size": 2}, {"dp", "dp_cp", "dp_replicate"}),
        ({"cp_size": 2}, {"dp_shard_cp", "dp_cp", "cp"}),
    ],
    ids=["fsdp-only", "ddp-only", "cp-only"],
)
def test_one_active_dimension_has_every_documented_flat_name(
    dist_pool: DistributedPool, sizes: dict, names: set
) -> None:
    for facts in dist_pool.run(rank_mesh_facts, sizes):
        rank = facts.pop("rank")
        ranks = facts.pop("ranks")
        assert set(facts) == names
        assert all(value == (2, rank) for value in facts.values()), facts
        expected = {
            "dp_shard_size": (0, rank, 0, 0),  # data_parallel_rank is the dp_replicate rank: none here
            "dp_replicate_size": (rank, 0, 0, 0),
            "cp_size": (0, 0, 0, rank),
        }[next(iter(sizes))]
        assert ranks == expected


@pytest.mark.parametrize(
    ("sizes", "expected"),
    [
        # rank r sits at (r // 2, r % 2) of a 2 x 2 mesh
        (
            {"dp_shard_size": 2, "tp_size": 2},
            lambda r: {
                "dp": (2, r // 2),
                "dp_cp": (2, r // 2),
                "dp_shard_cp": (2, r // 2),
                "tp": (2, r % 2),
                "ranks": (0, r // 2, r % 2, 0),
            },
        ),
        (
            {"dp_replicate_size": 2, "dp_shard_size": 2},
            lambda r: {
                "dp": (4, r),
                "dp_cp": (4, r),
                "dp_shard_cp": (2, r % 2),
                "dp_replicate": (2, r // 2),
                "ranks": (r // 2, r % 2, 0, 0),
            },
        ),
    ],
    ids=["dp_shard2xtp2", "hsdp2x2"],
)
def test_four_processes_flat_names_and_ranks(pool4: DistributedPool, sizes: dict, expected) -> None:
    for facts in pool4.run(rank_mesh_facts, sizes):
        want = expected(facts["rank"])
        assert {key: facts[key] for key in want} == want


def rank_presharded_tp() -> dict:
    reset_shared_state()
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from accel_train import Accelerator

    accelerator = Accelerator(parallelism_config=ParallelismConfig(tp_size=2))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))  # no tp_plan
    dense = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    dense.load_state_dict(model.state_dict())
    parallelize_module(model, accelerator.torch_device_mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    split = model[0].weight
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
    out = model(x)
    accelerator.backward(out.pow(2).sum())
    optimizer.step()
    dense_out = dense(x)
    dense_out.pow(2).sum().backward()
    with torch.no_grad():
        for param in dense.parameters():
            param -= 0.1 * param.grad
    full = {k: (v.full_tensor() if isinstance(v, DTensor) else v) for k, v in model.state_dict().items()}
    facts = {
        "same_param": accelerator.unwrap_model(model)[0].weight is split,
        "local_rows": model[0].weight.to_local().shape[0],
        "out_diff": (out - dense_out).abs().max().item(),
        "param_diff": max((full[k] - v).abs().max().item() for k, v in dense.state_dict().items()),
    }
    reset_shared_state()
    return facts


def test_a_model_split_by_the_user_is_prepared_as_it_is(dist_pool: DistributedPool) -> None:
    for facts in dist_pool.run(rank_presharded_tp):
        assert facts["same_param"] and facts["local_rows"] == 4
        assert facts["out_diff"] < 1e-5 and facts["param_diff"] < 1e-5
