"""Enumerations shared by every accel package (documented names and values).

Kept free of torch so the launcher and the CLI can use them without importing it.
"""

from __future__ import annotations

import enum


class _StrEnum(str, enum.Enum):
    """A string enum whose members compare equal to their value and print as it."""

    def __str__(self) -> str:
        return str(self.value)

    @classmethod
    def list(cls) -> list[str]:
        """All values, in definition order."""
        return [member.value for member in cls]

    @classmethod
    def parse(cls, value: object) -> _StrEnum:
        """Member for ``value`` (member, value or name, case-insensitive), else a clear error."""
        if isinstance(value, cls):
            return value
        text = str(value.value if isinstance(value, enum.Enum) else value).strip()
        for member in cls:
            if text.lower() in (member.value.lower(), member.name.lower()):
                return member
        raise ValueError(f"{value!r} is not a valid {cls.__name__}; choose one of {cls.list()}")


class _NamedStrEnum(_StrEnum):
    """A string enum that prints as ``Class.MEMBER`` (``str()`` and f-strings), as the documented
    ``DistributedType``, ``SageMakerDistributedType`` and ``ComputeEnvironment`` do; it still compares
    equal to its value, and ``.value`` is the plain string."""

    def __str__(self) -> str:
        return f"{type(self).__name__}.{self.name}"

    def __format__(self, format_spec: str) -> str:
        return format(str(self), format_spec)


class DistributedType(_NamedStrEnum):
    """How the processes of a run are organised."""

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    MULTI_NPU = "MULTI_NPU"
    MULTI_MLU = "MULTI_MLU"
    MULTI_SDAA = "MULTI_SDAA"
    MULTI_MUSA = "MULTI_MUSA"
    MULTI_HPU = "MULTI_HPU"
    MULTI_XPU = "MULTI_XPU"
    MULTI_NEURON = "MULTI_NEURON"
    DEEPSPEED = "DEEPSPEED"
    FSDP = "FSDP"
    XLA = "XLA"
    MEGATRON_LM = "MEGATRON_LM"


class SageMakerDistributedType(_NamedStrEnum):
    """Distribution modes of Amazon SageMaker."""

    NO = "NO"
    DATA_PARALLEL = "DATA_PARALLEL"
    MODEL_PARALLEL = "MODEL_PARALLEL"


class ComputeEnvironment(_NamedStrEnum):
    """Where the run happens."""

    LOCAL_MACHINE = "LOCAL_MACHINE"
    AMAZON_SAGEMAKER = "AMAZON_SAGEMAKER"


class PrecisionType(_StrEnum):
    """Mixed-precision modes."""

    NO = "no"
    FP8 = "fp8"
    FP16 = "fp16"
    BF16 = "bf16"


#: The ``mixed_precision`` values in the order the launcher, its questionnaire and its config reader
#: show them (the one list every accel package offers; members of `PrecisionType`).
MIXED_PRECISION_CHOICES: tuple[str, ...] = (
    PrecisionType.NO.value,
    PrecisionType.FP16.value,
    PrecisionType.BF16.value,
    PrecisionType.FP8.value,
)


class RNGType(_StrEnum):
    """Random number generators that can be synchronised across processes."""

    TORCH = "torch"
    CUDA = "cuda"
    MLU = "mlu"
    SDAA = "sdaa"
    MUSA = "musa"
    NPU = "npu"
    XLA = "xla"
    XPU = "xpu"
    HPU = "hpu"
    NEURON = "neuron"
    GENERATOR = "generator"


class DynamoBackend(_StrEnum):
    """Backends accepted by ``torch.compile`` (``NO`` disables compilation)."""

    NO = "NO"
    EAGER = "EAGER"
    AOT_EAGER = "AOT_EAGER"
    INDUCTOR = "INDUCTOR"
    AOT_TS_NVFUSER = "AOT_TS_NVFUSER"
    NVPRIMS_NVFUSER = "NVPRIMS_NVFUSER"
    CUDAGRAPHS = "CUDAGRAPHS"
    OFI = "OFI"
    FX2TRT = "FX2TRT"
    ONNXRT = "ONNXRT"
    TENSORRT = "TENSORRT"
    NEURON = "NEURON"
    AOT_TORCHXLA_TRACE_ONCE = "AOT_TORCHXLA_TRACE_ONCE"
    TORCHXLA_TRACE_ONCE = "TORCHXLA_TRACE_ONCE"
    IPEX = "IPEX"
    TVM = "TVM"
    HPU_BACKEND = "HPU_BACKEND"


# -- choice tables of the backends ---------------------------------------------------------------------
# One enum per list of choices. The launcher's flags and config validation, the ``config`` questionnaire,
# ``to-fsdp2`` and the plugins of accel-train all read these, so the lists cannot drift apart.


class _NumberedChoice(_StrEnum):
    """A choice that may also be given by its 1-based position (the documented numeric spelling)."""

    @classmethod
    def parse(cls, value: object) -> _StrEnum:
        text = str(value.value if isinstance(value, enum.Enum) else value).strip()
        members = list(cls)
        if text.isdigit() and 1 <= int(text) <= len(members):
            return members[int(text) - 1]
        return super().parse(value)


class FSDPShardingStrategy(_NumberedChoice):
    """FSDP1 sharding strategies (1-5 in launcher files, in this order)."""

    FULL_SHARD = "FULL_SHARD"
    SHARD_GRAD_OP = "SHARD_GRAD_OP"
    NO_SHARD = "NO_SHARD"
    HYBRID_SHARD = "HYBRID_SHARD"
    HYBRID_SHARD_ZERO2 = "HYBRID_SHARD_ZERO2"


class FSDPAutoWrapPolicy(_StrEnum):
    """Which submodules FSDP wraps as units."""

    TRANSFORMER_BASED_WRAP = "TRANSFORMER_BASED_WRAP"
    SIZE_BASED_WRAP = "SIZE_BASED_WRAP"
    NO_WRAP = "NO_WRAP"


class FSDPBackwardPrefetch(_NumberedChoice):
    """When FSDP fetches the next unit's parameters during backward."""

    BACKWARD_PRE = "BACKWARD_PRE"
    BACKWARD_POST = "BACKWARD_POST"
    NO_PREFETCH = "NO_PREFETCH"


class FSDPStateDictType(_NumberedChoice):
    """How an FSDP model's state dict is taken (LOCAL is FSDP1 only)."""

    FULL_STATE_DICT = "FULL_STATE_DICT"
    LOCAL_STATE_DICT = "LOCAL_STATE_DICT"
    SHARDED_STATE_DICT = "SHARDED_STATE_DICT"


class OffloadDevice(_StrEnum):
    """Where DeepSpeed offloads optimizer states or parameters."""

    NONE = "none"
    CPU = "cpu"
    NVME = "nvme"


#: The ZeRO optimisation stages DeepSpeed knows.
ZERO_STAGES: tuple[int, ...] = (0, 1, 2, 3)


class FP8BackendType(_StrEnum):
    """FP8 kernels: TransformerEngine, MS-AMP or torchao (``NO``: none chosen)."""

    NO = "NO"
    TE = "TE"
    MSAMP = "MSAMP"
    AO = "AO"


class FP8Format(_StrEnum):
    """FP8 formats of TransformerEngine recipes."""

    HYBRID = "HYBRID"
    E4M3 = "E4M3"
    E5M2 = "E5M2"


class AmaxComputeAlgorithm(_StrEnum):
    """How TransformerEngine turns the amax history into a scale."""

    MAX = "max"
    MOST_RECENT = "most_recent"


class MSAMPOptLevel(_StrEnum):
    """MS-AMP optimisation levels (the letter O, not zero)."""

    O1 = "O1"
    O2 = "O2"


class ContextParallelCommStrategy(_StrEnum):
    """How context-parallel ranks exchange keys and values."""

    ALLGATHER = "allgather"
    ALLTOALL = "alltoall"
