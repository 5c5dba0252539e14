"""Launching a training job on Amazon SageMaker from a ``SageMakerConfig`` (needs the ``sagemaker`` extra).

``sagemaker_job_args`` is pure: it turns the config and the script's arguments into the estimator's
keyword arguments, the hyper-parameters and the input channels.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from accel_launch.values import ConfigError


def _hyperparameters(script_args: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """``--name value`` / ``--flag`` pairs of the script's arguments as SageMaker hyper-parameters."""
    params: dict[str, Any] = {}
    args = list(script_args)
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--"):
            raise ConfigError(f"SageMaker passes script arguments as named hyper-parameters; {arg!r} has no --name")
        name = arg[2:]
        if "=" in name:
            name, value = name.split("=", 1)
            params[name] = value
            i += 1
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            params[name] = args[i + 1]
            i += 2
        else:
            params[name] = True
            i += 1
    return params


def _read_tsv(path: str | None, columns: int) -> list[list[str]]:
    if not path:
        return []
    rows = []
    for n, line in enumerate(Path(path).read_text().splitlines()):
        if n == 0 or not line.strip():
            continue  # header
        parts = line.split("\t")
        if len(parts) != columns:
            raise ConfigError(f"{path}, line {n + 1}: expected {columns} tab-separated columns, got {len(parts)}")
        rows.append(parts)
    return rows


def sagemaker_job_args(
    config: Any, plan: Any, credentials: dict[str, str] | None = None
) -> tuple[dict[str, Any], dict[str, str] | None]:
    """Estimator keyword arguments and input channels of a SageMaker job for ``plan`` (pure)."""
    script = Path(plan.training_script)
    if script.suffix != ".py":
        raise ConfigError(f"SageMaker runs Python scripts; {plan.training_script!r} does not end in .py")
    env = dict(plan.env)
    env["ACCELERATE_USE_SAGEMAKER"] = "true"
    mode = str(getattr(config.distributed_type, "value", config.distributed_type))
    env["ACCELERATE_SAGEMAKER_DISTRIBUTED_TYPE"] = mode
    distribution = None
    if mode == "DATA_PARALLEL":
        distribution = {"smdistributed": {"dataparallel": {"enabled": True}}}
    metrics = [{"Name": name, "Regex": regex} for name, regex in _read_tsv(config.sagemaker_metrics_file, 2)]
    inputs = {name: uri for name, uri in _read_tsv(config.sagemaker_inputs_file, 2)} or None
    kwargs: dict[str, Any] = {
        "image_uri": config.image_uri,
        "entry_point": script.name,
        "source_dir": str(script.parent.resolve()),
        "role": config.iam_role_name,
        "transformers_version": config.transformers_version,
        "pytorch_version": config.pytorch_version,
        "py_version": config.py_version,
        "base_job_name": config.base_job_name,
        "instance_count": config.num_machines,
        "instance_type": config.ec2_instance_type,
        "debugger_hook_config": False,
        "distribution": distribution,
        "hyperparameters": _hyperparameters(plan.training_script_args),
        "environment": env,
        "metric_definitions": metrics or None,
    }
    kwargs.update(config.additional_args or {})
    return kwargs, inputs


def sagemaker_launch(plan: Any) -> int:
    """Create the estimator and fit it (needs the ``sagemaker`` extra of accel-launch)."""
    from accel_state.imports import is_sagemaker_available
    from accel_state.install_hints import install_hint

    if not is_sagemaker_available():
        raise ConfigError(f"a SageMaker launch needs the sagemaker SDK: {install_hint('accel-launch', 'sagemaker')}")
    from sagemaker.huggingface import HuggingFace

    config = plan.extra.get("config")
    values = plan.values
    if values.get("aws_access_key_id"):
        os.environ["AWS_ACCESS_KEY_ID"] = values["aws_access_key_id"]
        os.environ["AWS_SECRET_ACCESS_KEY"] = values.get("aws_secret_access_key") or ""
    elif config.profile:
        os.environ["AWS_PROFILE"] = config.profile
    os.environ["AWS_DEFAULT_REGION"] = config.region
    kwargs, inputs = sagemaker_job_args(config, plan)
    print("Configuring Amazon SageMaker environment")
    estimator = HuggingFace(**kwargs)
    estimator.fit(inputs=inputs)
    print(f"You can find your model data at: {estimator.model_data}")
    return 0
