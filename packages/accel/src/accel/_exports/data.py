"""Names and module paths that accel-data provides to the meta-package."""

_D = "accel_data"

TOP_LEVEL: dict[str, str] = {
    "skip_first_batches": f"{_D}.data_loader",
    "DataLoaderConfiguration": f"{_D}.config",
}
UTILS: dict[str, str] = {
    "DataLoaderConfiguration": f"{_D}.config",
}
MODULES: dict[str, str] = {
    "accel.data_loader": f"{_D}.data_loader",
}
