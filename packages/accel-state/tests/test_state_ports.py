"""``free_port``: the port it returns is free for a store to bind, and no other port-0 bind gets it
meanwhile (the race that made a pool's rendezvous fail with EADDRINUSE)."""

from __future__ import annotations

import errno
import socket
from datetime import timedelta

import pytest
import torch.distributed as dist

from accel_state.ports import free_port


@pytest.mark.parametrize("host", ["127.0.0.1", ""], ids=["loopback", "every-interface"])
def test_the_port_is_kept_from_a_plain_bind(host: str) -> None:
    port = free_port(host)
    with socket.socket() as plain, pytest.raises(OSError) as raised:
        plain.bind(("127.0.0.1", port))  # what a port-0 bind elsewhere would also be refused
    assert raised.value.errno == errno.EADDRINUSE


def test_port_zero_binds_never_hand_out_a_kept_port() -> None:
    kept = {free_port() for _ in range(20)}
    handed = set()
    for _ in range(2000):
        with socket.socket() as other:
            other.bind(("127.0.0.1", 0))
            handed.add(other.getsockname()[1])
    assert not kept & handed


@pytest.mark.parametrize("host", ["127.0.0.1", ""], ids=["loopback", "every-interface"])
def test_a_store_binds_the_port_at_once(host: str) -> None:
    port = free_port(host)
    store = dist.TCPStore("127.0.0.1", port, 1, True, timedelta(seconds=10), wait_for_workers=False)
    store.set("key", "value")
    assert store.get("key") == b"value"
    assert store.port == port


def test_nothing_listens_on_the_port() -> None:
    port = free_port()
    with socket.socket() as probe:
        probe.settimeout(1.0)
        assert probe.connect_ex(("127.0.0.1", port)) != 0
