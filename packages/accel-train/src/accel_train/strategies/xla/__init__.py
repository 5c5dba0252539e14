"""XLA / TPU training on torch_xla's public API (the strategy is in `strategy`; no import here)."""
