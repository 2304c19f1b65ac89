"""Free loopback ports for the services the demo and the tests start."""

from __future__ import annotations

import socket

# Ports this process handed out: the kernel may offer a just-closed port again
# (a hub and its proxy once got the same one), so none is handed out twice.
_handed_out: set[int] = set()


def free_port() -> int:
    """A free TCP port on 127.0.0.1, not handed out before by this process."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port
