"""Moved to :mod:`accel_train.strategies.megatron.plugin` (this path stays for imports)."""

from accel_train.strategies.megatron.plugin import MegatronLMPlugin as MegatronLMPlugin
