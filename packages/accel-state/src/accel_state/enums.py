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
    AOT_TORCHXLA_TRACE_ONCE = "AOT_TORCHXLA_TRACE_ONCE"
    TORCHXLA_TRACE_ONCE = "TORCHXLA_TRACE_ONCE"
    IPEX = "IPEX"
    TVM = "TVM"
    HPU_BACKEND = "HPU_BACKEND"
