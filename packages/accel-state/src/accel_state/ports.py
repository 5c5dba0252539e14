"""A free TCP port that stays free until the process group's store takes it.

The usual way to find a free port (bind port 0, read the number, close) has a race: the kernel may
hand the same number to the next port-0 bind of any process on the machine (gloo alone opens many)
before the store of the new process group binds it, and the group then fails with ``EADDRINUSE``.
``free_port`` closes that window without holding a socket open: it makes one connection to the new
port and closes the server's end first, which leaves that end in ``TIME_WAIT`` for about a minute.
While it waits the kernel gives the port to no port-0 bind, yet a server that sets ``SO_REUSEADDR``
(torch's ``TCPStore`` does, as do most servers) binds it at once.
"""

from __future__ import annotations

import socket

__all__ = ["free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that nothing listens on, kept from other port-0 binds for about a minute.

    Args:
        host: The address to find the port on: ``"127.0.0.1"`` (the default) for a single machine,
            ``""`` for every interface (a port other machines will connect to).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, 0))
        port = int(listener.getsockname()[1])
        try:
            listener.listen(1)
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                server_end, _ = listener.accept()
                server_end.close()  # the server's end closes first, so it is the one left in TIME_WAIT
        except OSError:
            pass  # no loopback connection here: the port is still free now, only not kept
    return port
