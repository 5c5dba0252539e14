"""The one device-mesh builder refuses, by name, a mesh that cannot be built, before touching torch's.

Real meshes are built by the multi-rank tests of FSDP, the ND strategy and the pipeline, which all go
through `build_mesh`; here, one process without a process group (world size 1)."""

from __future__ import annotations

import pytest

from accel_train.strategies.mesh import build_mesh


@pytest.mark.parametrize(
    ("dims", "flattened", "message"),
    [
        ([("dp_shard", 2)], None, r"a device mesh of dp_shard 2 needs 2 processes, but the run has 1"),
        ([("pp", 1), ("pp", 1)], None, r"distinct names, got \['pp', 'pp'\]"),
        ([("tp", 0)], None, r"sizes must be >= 1, got \{'tp': 0\}"),
        ([("dp_shard", 1)], {"dp": ["dp_replicate", "dp_shard"]}, r"cannot flatten \['dp_replicate'\] into 'dp'"),
    ],
)
def test_a_mesh_that_cannot_be_built_is_named(dims, flattened, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_mesh("cpu", dims, flattened)
