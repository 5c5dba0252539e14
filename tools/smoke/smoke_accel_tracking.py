"""accel-tracking installed alone: the default tracker ("all" with no backend installed is the JSON-lines one)."""

from __future__ import annotations

import glob
import os
import tempfile

from _common import check, installed_distributions

from accel_tracking import LOGGER_TYPE_TO_CLASS, filter_trackers, finish_all, log_to_all, read_jsonl


def main() -> None:
    print("installed:", ", ".join(installed_distributions()))
    import torch

    with tempfile.TemporaryDirectory() as folder:
        names = filter_trackers("all", logging_dir=folder)
        check(names == ["jsonl"], f'filter_trackers("all") with no backend installed gave {names}, expected ["jsonl"]')
        trackers = [LOGGER_TYPE_TO_CLASS[name]("smoke", folder) for name in names]
        for tracker in trackers:
            tracker.store_init_configuration({"lr": 1e-3, "layers": [8, 4], "path": folder})
        for step in range(3):
            log_to_all(trackers, {"loss": torch.tensor(1.0 / (step + 1)), "step_nan": float("nan")}, step=step)
        finish_all(trackers)
        files = glob.glob(os.path.join(folder, "**", "*.jsonl"), recursive=True)
        check(len(files) == 1, f"expected one run file, found {files}")
        records = list(read_jsonl(files[0]))
        check([r["event"] for r in records] == ["config", "log", "log", "log"], f"records: {records}")
        check(
            abs(records[-1]["values"]["loss"] - 1.0 / 3) < 1e-6 and records[-1]["step"] == 2,
            f"last loss logged as {records[-1]['values']}",
        )
    print("accel-tracking smoke: default (JSON-lines) tracker config, log and finish OK")


if __name__ == "__main__":
    main()
