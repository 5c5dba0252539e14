"""Resuming mid-epoch the documented way, through the real ``accel launch`` (2 CPU processes, gloo).

The script skips the batches it already trained on with ``skip_first_batches`` or with a ``continue``
over the first steps (it does not opt in to ``use_stateful_dataloader=True``, which would skip them by
itself). Under FSDP2 and DeepSpeed ZeRO-3 with the default loader (left as prepared by ``load_state``,
as in the documented system) a save in the first epoch resumes to the parameters of the uninterrupted
run: the loader shuffles with a generator of its own, so the first epoch's order comes back. Under DDP
the script opts in to accel's ``replay_epoch_on_resume=True`` and saves in the second epoch, which the
default would read in the first epoch's order. Neither way skips the seen batches twice.
CI runs the MULTI_CPU case; the FSDP2 and ZeRO-3 cases run before a release (``nox -s slow``).
"""

from __future__ import annotations

import json
import pathlib
import textwrap

import pytest
from conftest import accel_command, run_command

from accel_state.imports import is_deepspeed_available

SCRIPT = textwrap.dedent(
    """
    import json, os, sys, torch
    from accel_data import DataLoaderConfiguration
    from accel_train import Accelerator

    # PHASE is "first" (train, save), or one resume or more ("continue", "skip_first_batches"), each run in turn
    # in this process from the same checkpoint, with a model, an optimizer, a loader and an Accelerator of its own
    folder, replay, phases = sys.argv[1], sys.argv[2] == "replay", sys.argv[3:]
    # save after 3 of the 6 steps of the first epoch (the second with the replay opt-in)
    EPOCHS, SAVE_EPOCH, SAVE_AT = 2, (1 if replay else 0), 3

    def run(phase):
        # the default: no automatic position; or accel's opt-in that replays the interrupted epoch
        accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(replay_epoch_on_resume=replay))
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        g = torch.Generator().manual_seed(0)
        x = torch.randn(48, 4, generator=g)
        data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True) ** 2)
        loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True)  # order matters
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

        def step(x, y):
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            optimizer.step()
            optimizer.zero_grad()

        start_epoch = 0
        if phase != "first":
            accelerator.load_state(os.path.join(folder, "ckpt"))
            start_epoch = SAVE_EPOCH
        for epoch in range(start_epoch, EPOCHS):
            resuming = phase != "first" and epoch == SAVE_EPOCH
            batches = loader
            if resuming and phase == "skip_first_batches":
                batches = accelerator.skip_first_batches(loader, SAVE_AT)
            for index, (x, y) in enumerate(batches):
                if resuming and phase == "continue" and index < SAVE_AT:
                    continue
                step(x, y)
                if phase == "first" and epoch == SAVE_EPOCH and index + 1 == SAVE_AT:
                    accelerator.save_state(os.path.join(folder, "ckpt"))
        state = {k: v.float().flatten().tolist() for k, v in accelerator.get_state_dict(model).items()}
        if accelerator.is_main_process:
            with open(os.path.join(folder, phase + ".json"), "w") as handle:
                json.dump({"state": state, "distributed_type": accelerator.distributed_type.value}, handle)
        return accelerator

    for phase in phases:
        accelerator = run(phase)
    accelerator.end_training()
    """
)

COMMON = "compute_environment: LOCAL_MACHINE\nuse_cpu: true\nnum_machines: 1\nnum_processes: 2\nmixed_precision: 'no'\n"
CONFIGS = {
    "MULTI_CPU": COMMON + "distributed_type: MULTI_CPU\n",
    "FSDP": COMMON
    + "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n  fsdp_state_dict_type: SHARDED_STATE_DICT\n",
    "DEEPSPEED": COMMON
    + "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 3\n  zero3_init_flag: false\n"
    + "  gradient_accumulation_steps: 1\n  zero3_save_16bit_model: true\n",
}
needs_deepspeed = pytest.mark.skipif(not is_deepspeed_available(), reason='needs "accel-train[deepspeed]"')

# The sharded variants run before a release (`nox -s slow`): each of their parts has a CI test of its own.
# The manual skip after load_state is the MULTI_CPU case's; the default loader's order after a first-epoch
# save on two processes is test_resume_order_reference.py's two-processes-epoch-0 case (every batch equals
# the documented system's); the sharded state coming back exactly in a fresh launch is test_fsdp_launch.py's
# and test_deepspeed_launch.py's resume test (those run in CI anyway; each variant here is three launches more).
_COVERED = "the MULTI_CPU case, test_resume_order_reference.py's two-processes-epoch-0 case and "
sharded_release = {
    "FSDP": pytest.mark.release(covered_by=_COVERED + "test_fsdp_launch.py::test_fsdp2_config_resume_and_merge"),
    "DEEPSPEED": pytest.mark.release(
        covered_by=_COVERED + "test_deepspeed_launch.py::test_zero3_config_file_save_and_resume_in_a_fresh_launch"
    ),
}


@pytest.mark.parametrize(
    ("backend", "loader", "resumes"),
    [
        ("MULTI_CPU", "replay", ("continue", "skip_first_batches")),
        pytest.param("FSDP", "default", ("continue", "skip_first_batches"), marks=sharded_release["FSDP"]),
        pytest.param(
            "DEEPSPEED",
            "default",
            ("continue", "skip_first_batches"),
            marks=[needs_deepspeed, sharded_release["DEEPSPEED"]],
        ),
    ],
)
def test_resume_with_a_manual_skip_ends_like_the_uninterrupted_run(
    tmp_path: pathlib.Path, backend: str, loader: str, resumes: tuple[str, ...]
) -> None:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    config = tmp_path / "accel.yaml"
    config.write_text(CONFIGS[backend])
    # the first run, then the resumes: under MULTI_CPU one launch runs them in turn (a launch fewer); the sharded
    # variants launch each resume alone (a second Accelerator with a DeepSpeed plugin in one process is refused)
    launches = [["first"], list(resumes)] if backend == "MULTI_CPU" else [["first"], *([phase] for phase in resumes)]
    for phases in launches:
        result = run_command(
            [*accel_command(), "launch", "--config_file", str(config), str(script), str(tmp_path), loader, *phases],
            timeout=600,
        )
        assert result.returncode == 0, (phases, (result.stdout + result.stderr)[-4000:])
    first = json.loads((tmp_path / "first.json").read_text())
    assert first["distributed_type"] == backend
    for phase in resumes:
        resumed = json.loads((tmp_path / f"{phase}.json").read_text())
        assert resumed["state"].keys() == first["state"].keys()
        for key, values in first["state"].items():
            assert resumed["state"][key] == pytest.approx(values, abs=1e-6), (phase, key)
