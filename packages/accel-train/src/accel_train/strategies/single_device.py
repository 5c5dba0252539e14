"""One process, one device: the base strategy as it is."""

from __future__ import annotations

from accel_train.strategies.base import Strategy

__all__ = ["SingleDeviceStrategy"]


class SingleDeviceStrategy(Strategy):
    """The model runs whole on this process's device; nothing is wrapped or synchronised."""

    name = "single_device"
    main_process_saves_alone = True
