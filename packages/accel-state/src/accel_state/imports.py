"""Cheap, cached checks for optional packages and devices.

Package checks look at import specs and distribution metadata only: they never import the package.
Device checks import torch on first call and cache the answer.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from functools import cache, lru_cache

from accel_state.versions import compare_versions


@cache
def _is_package_available(import_name: str, metadata_name: str | None = None) -> bool:
    """True when ``import_name`` can be imported and its distribution metadata is present."""
    try:
        if importlib.util.find_spec(import_name) is None:
            return False
    except (ImportError, ValueError):
        return False
    try:
        importlib.metadata.version(metadata_name or import_name)
    except importlib.metadata.PackageNotFoundError:
        return metadata_name is None and import_name in ("torch_xla",)
    return True


def _version_ok(metadata_name: str, min_version: str | None) -> bool:
    return min_version is None or compare_versions(importlib.metadata.version(metadata_name), ">=", min_version)


def is_torch_available() -> bool:
    """True when torch is installed."""
    return _is_package_available("torch")


def is_numpy_available() -> bool:
    """True when numpy is installed."""
    return _is_package_available("numpy")


def is_safetensors_available() -> bool:
    """True when safetensors is installed."""
    return _is_package_available("safetensors")


def is_yaml_available() -> bool:
    """True when PyYAML is installed."""
    return _is_package_available("yaml", "pyyaml")


def is_psutil_available() -> bool:
    """True when psutil is installed."""
    return _is_package_available("psutil")


def is_tqdm_available() -> bool:
    """True when tqdm is installed."""
    return _is_package_available("tqdm")


def is_rich_available() -> bool:
    """True when rich is installed."""
    return _is_package_available("rich") and os.environ.get("ACCELERATE_DISABLE_RICH", "").lower() not in ("1", "true")


def is_huggingface_hub_available() -> bool:
    """True when huggingface_hub is installed."""
    return _is_package_available("huggingface_hub", "huggingface-hub")


def is_transformers_available() -> bool:
    """True when transformers is installed."""
    return _is_package_available("transformers")


def is_timm_available() -> bool:
    """True when timm is installed."""
    return _is_package_available("timm")


def is_datasets_available() -> bool:
    """True when datasets is installed."""
    return _is_package_available("datasets")


def is_peft_available() -> bool:
    """True when peft is installed."""
    return _is_package_available("peft")


def is_pandas_available() -> bool:
    """True when pandas is installed."""
    return _is_package_available("pandas")


def is_matplotlib_available() -> bool:
    """True when matplotlib is installed."""
    return _is_package_available("matplotlib")


def is_boto3_available() -> bool:
    """True when boto3 is installed."""
    return _is_package_available("boto3")


def is_sagemaker_available() -> bool:
    """True when sagemaker is installed."""
    return _is_package_available("sagemaker")


def is_torchvision_available() -> bool:
    """True when torchvision is installed."""
    return _is_package_available("torchvision")


def is_triton_available() -> bool:
    """True when triton is installed."""
    return _is_package_available("triton")


def is_pynvml_available() -> bool:
    """True when pynvml is installed."""
    return _is_package_available("pynvml", "nvidia-ml-py") or _is_package_available("pynvml")


def is_torchdata_available() -> bool:
    """True when torchdata is installed."""
    return _is_package_available("torchdata")


def is_torchdata_stateful_dataloader_available() -> bool:
    """True when torchdata's ``StatefulDataLoader`` is installed."""
    if not is_torchdata_available():
        return False
    return _version_ok("torchdata", "0.8.0") and importlib.util.find_spec("torchdata.stateful_dataloader") is not None


def is_deepspeed_available() -> bool:
    """True when deepspeed is installed."""
    return _is_package_available("deepspeed")


def is_megatron_lm_available() -> bool:
    """True when Megatron-LM (megatron-core) is installed."""
    return _is_package_available("megatron", "megatron-core") or _is_package_available("megatron")


def is_bnb_available(min_version: str | None = None) -> bool:
    """True when bitsandbytes (at least ``min_version`` when given) is installed.

    Args:
        min_version: The oldest version that counts as available; `None` accepts any.
    """
    return _is_package_available("bitsandbytes") and _version_ok("bitsandbytes", min_version)


def is_8bit_bnb_available() -> bool:
    """True when bitsandbytes with 8-bit layers is installed."""
    return is_bnb_available("0.37.2")


def is_4bit_bnb_available() -> bool:
    """True when bitsandbytes with 4-bit layers is installed."""
    return is_bnb_available("0.39.0")


def is_bitsandbytes_multi_backend_available() -> bool:
    """True when a multi-backend bitsandbytes (CPU and non-CUDA devices) is installed."""
    return is_bnb_available("0.45.0")


def is_transformer_engine_available() -> bool:
    """True when TransformerEngine is installed."""
    return _is_package_available("transformer_engine", "transformer-engine") or _is_package_available(
        "transformer_engine", "transformer_engine"
    )


def is_msamp_available() -> bool:
    """True when MS-AMP is installed."""
    return _is_package_available("msamp", "ms-amp") or _is_package_available("msamp")


def is_torchao_available() -> bool:
    """True when torchao is installed."""
    return _is_package_available("torchao")


def is_lomo_available() -> bool:
    """True when the LOMO optimizers (lomo-optim) is installed."""
    return _is_package_available("lomo_optim", "lomo-optim")


def is_schedulefree_available() -> bool:
    """True when schedulefree is installed."""
    return _is_package_available("schedulefree")


def is_tensorboard_available() -> bool:
    """True when tensorboard is installed."""
    return _is_package_available("tensorboard") or _is_package_available("tensorboardX")


def is_wandb_available() -> bool:
    """True when wandb is installed."""
    return _is_package_available("wandb")


def is_comet_ml_available() -> bool:
    """True when comet_ml is installed."""
    return _is_package_available("comet_ml", "comet-ml") or _is_package_available("comet_ml")


def is_aim_available() -> bool:
    """True when aim is installed."""
    return _is_package_available("aim")


def is_mlflow_available() -> bool:
    """True when mlflow is installed."""
    return _is_package_available("mlflow") or _is_package_available("mlflow", "mlflow-skinny")


def is_clearml_available() -> bool:
    """True when clearml is installed."""
    return _is_package_available("clearml")


def is_dvclive_available() -> bool:
    """True when dvclive is installed."""
    return _is_package_available("dvclive")


def is_trackio_available() -> bool:
    """True when trackio is installed."""
    return _is_package_available("trackio")


def is_swanlab_available() -> bool:
    """True when swanlab is installed."""
    return _is_package_available("swanlab")


def use_torch_xla() -> bool:
    """``USE_TORCH_XLA`` read now (default true): false keeps an installed torch_xla out of the run.

    Raises:
        ValueError: the variable holds something that is not a yes or a no; the message names it.
    """
    from accel_state.environment import str_to_bool

    raw = os.environ.get("USE_TORCH_XLA", "")
    if raw.strip() == "":
        return True
    try:
        return bool(str_to_bool(raw))
    except ValueError:
        raise ValueError(f"USE_TORCH_XLA={raw!r} is not a yes or a no: use 1/0, true/false, yes/no or on/off") from None


def is_torch_xla_available(check_is_tpu: bool = False, check_is_gpu: bool = False) -> bool:
    """True when torch_xla is importable and not switched off by ``USE_TORCH_XLA`` (and, if asked, runs on
    TPU or GPU).

    Looks up the import spec only (torch_xla is not imported unless ``check_is_tpu``/``check_is_gpu``
    asks for the device kind), so the answer is cheap and needs no torch_xla where it is absent.

    Args:
        check_is_tpu: Only true when XLA runs on a TPU.
        check_is_gpu: Only true when XLA runs on a GPU.
    """
    if not use_torch_xla() or importlib.util.find_spec("torch_xla") is None:
        return False
    if not (check_is_tpu or check_is_gpu):
        return True
    try:
        import torch_xla.runtime as xr  # type: ignore[import-not-found]

        device = xr.device_type()
    except Exception:
        return False
    return (check_is_tpu and device == "TPU") or (check_is_gpu and device in ("GPU", "CUDA"))


def is_ipex_available() -> bool:
    """True when Intel Extension for PyTorch is installed."""
    return _is_package_available("intel_extension_for_pytorch")


def is_ccl_available() -> bool:
    """True when oneCCL bindings for PyTorch is installed."""
    return _is_package_available("oneccl_bindings_for_pytorch") or _is_package_available("torch_ccl")


def is_pippy_available() -> bool:
    """Pipeline parallelism ships inside torch as ``torch.distributed.pipelining`` (torch >= 2.4)."""
    return importlib.util.find_spec("torch.distributed.pipelining") is not None


# --- devices (import torch lazily, cached) -------------------------------------------------------


@lru_cache(maxsize=1)
def is_cuda_available() -> bool:
    """True when a CUDA device can be used; asks NVML first so it does not initialise CUDA."""
    import torch

    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    try:
        return bool(torch.cuda.is_available())
    except Exception:
        return False


@lru_cache(maxsize=1)
def is_mps_available(min_version: str = "1.12") -> bool:
    """True when PyTorch can use the Apple MPS backend.

    Args:
        min_version: The oldest version that counts as available; `None` accepts any.
    """
    import torch

    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available() and backend.is_built())


@lru_cache(maxsize=1)
def is_xpu_available(check_device: bool = False) -> bool:
    """True when PyTorch can use the Intel XPU backend.

    Args:
        check_device: Also check that a device can actually be used (initialises the backend), not only that
            the library is installed.
    """
    import torch

    xpu = getattr(torch, "xpu", None)
    if xpu is None:
        return False
    try:
        return bool(xpu.is_available()) and (not check_device or xpu.device_count() > 0)
    except Exception:
        return False


def _device_module_available(name: str, package: str | None) -> bool:
    if package is not None and importlib.util.find_spec(package) is None:
        return False
    import torch

    if package is not None:
        try:
            importlib.import_module(package)
        except Exception:
            return False
    module = getattr(torch, name, None)
    try:
        return bool(module is not None and module.is_available())
    except Exception:
        return False


@lru_cache(maxsize=1)
def is_npu_available(check_device: bool = False) -> bool:
    """True when PyTorch can use the Ascend NPU backend.

    Args:
        check_device: Also check that a device can actually be used (initialises the backend), not only that
            the library is installed.
    """
    return _device_module_available("npu", "torch_npu")


@lru_cache(maxsize=1)
def is_mlu_available(check_device: bool = False) -> bool:
    """True when PyTorch can use the Cambricon MLU backend.

    Args:
        check_device: Also check that a device can actually be used (initialises the backend), not only that
            the library is installed.
    """
    return _device_module_available("mlu", "torch_mlu")


@lru_cache(maxsize=1)
def is_musa_available(check_device: bool = False) -> bool:
    """True when PyTorch can use the Moore Threads MUSA backend.

    Args:
        check_device: Also check that a device can actually be used (initialises the backend), not only that
            the library is installed.
    """
    return _device_module_available("musa", "torch_musa")


@lru_cache(maxsize=1)
def is_sdaa_available(check_device: bool = False) -> bool:
    """True when PyTorch can use the SDAA backend.

    Args:
        check_device: Also check that a device can actually be used (initialises the backend), not only that
            the library is installed.
    """
    return _device_module_available("sdaa", "torch_sdaa")


@lru_cache(maxsize=1)
def is_hpu_available(init_hccl: bool = False) -> bool:
    """True when PyTorch can use the Intel Gaudi HPU backend.

    Args:
        init_hccl: Also import the HCCL backend of torch.distributed.
    """
    return _device_module_available("hpu", "habana_frameworks")


@lru_cache(maxsize=1)
def is_bf16_available(ignore_tpu: bool = False) -> bool:
    """True when bf16 arithmetic is supported on the device this process would use (CPU counts).

    Args:
        ignore_tpu: Do not count a TPU as a bf16 device.
    """
    import torch

    if is_cuda_available():
        return bool(torch.cuda.is_bf16_supported())
    if is_mps_available():
        return True
    return True


@lru_cache(maxsize=1)
def is_fp16_available() -> bool:
    """True when fp16 mixed precision can run (any accelerator, or CPU with a recent torch)."""
    return True


@lru_cache(maxsize=1)
def is_fp8_available() -> bool:
    """True when an FP8 backend (TransformerEngine, MS-AMP or torchao) is installed."""
    return is_transformer_engine_available() or is_msamp_available() or is_torchao_available()


def is_mpi_available() -> bool:
    """True when this PyTorch build has the MPI backend of torch.distributed."""
    import torch.distributed as dist

    return bool(dist.is_available() and dist.is_mpi_available())


def is_import_timer_available() -> bool:
    """True when the ``import_timer`` package (import-time profiling) is installed."""
    return _is_package_available("import_timer")


def get_ccl_version() -> str:
    """Version of the installed Intel oneCCL bindings for PyTorch (``oneccl_bind_pt``)."""
    return importlib.metadata.version("oneccl_bind_pt")


def is_pytest_available() -> bool:
    """True when pytest is installed (the test helpers of ``accel_state.testing`` need it)."""
    return _is_package_available("pytest")


def is_weights_only_available() -> bool:
    """True when ``torch.load(weights_only=True)`` is there (torch >= 2.4 also knows safe globals)."""
    from accel_state.versions import is_torch_version

    return is_torch_version(">=", "2.4.0")


@lru_cache(maxsize=1)
def is_rocm_available() -> bool:
    """True when torch is a ROCm (HIP) build."""
    import torch

    return getattr(torch.version, "hip", None) is not None


@lru_cache(maxsize=1)
def is_xccl_available() -> bool:
    """True when torch.distributed has the XCCL backend (Intel GPUs, torch >= 2.7)."""
    import torch.distributed as dist

    check = getattr(dist, "is_xccl_available", None)
    return bool(dist.is_available() and check is not None and check())


def is_neuron_available() -> bool:
    """True when AWS Neuron's torch integration (torch_neuronx) is installed."""
    return _is_package_available("torch_neuronx")


@lru_cache(maxsize=1)
def is_habana_gaudi1() -> bool:
    """True on an Intel Gaudi 1 accelerator (HPU of the first generation)."""
    if not is_hpu_available():
        return False
    import habana_frameworks.torch.utils.experimental as htexp  # type: ignore[import-not-found]

    return bool(htexp._get_device_type() == htexp.synDeviceType.synDeviceGaudi)


def is_torchvision_v2_available() -> bool:
    """True when torchvision 0.15 or newer (its ``transforms.v2`` API) is installed."""
    return is_torchvision_available() and compare_versions(importlib.metadata.version("torchvision"), ">=", "0.15")


def is_amdsmi_available() -> bool:
    """True when AMD's amdsmi Python bindings are installed (GPU monitoring on ROCm)."""
    return _is_package_available("amdsmi")
