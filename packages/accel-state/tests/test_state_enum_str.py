"""Enums print as the documented system's do: Class.MEMBER for the plain str enums, the value for the others."""

from __future__ import annotations

import pytest

from accel_state.enums import (
    ComputeEnvironment,
    DistributedType,
    DynamoBackend,
    PrecisionType,
    SageMakerDistributedType,
)


@pytest.mark.parametrize(
    ("member", "printed"),
    [
        (DistributedType.MULTI_CPU, "DistributedType.MULTI_CPU"),
        (SageMakerDistributedType.DATA_PARALLEL, "SageMakerDistributedType.DATA_PARALLEL"),
        (ComputeEnvironment.LOCAL_MACHINE, "ComputeEnvironment.LOCAL_MACHINE"),
        (PrecisionType.BF16, "bf16"),
        (DynamoBackend.INDUCTOR, "INDUCTOR"),
    ],
)
def test_str_and_format(member, printed: str) -> None:
    assert str(member) == printed and f"{member}" == printed
    assert member == member.value  # still equal to its plain value


def test_parse_takes_a_member_of_another_enum_by_value() -> None:
    assert SageMakerDistributedType.parse(DistributedType.NO) is SageMakerDistributedType.NO
    assert DistributedType.parse("multi_cpu") is DistributedType.MULTI_CPU
