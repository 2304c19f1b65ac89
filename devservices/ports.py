"""Free loopback ports for the services the demo and the tests start."""

from __future__ import annotations

import random
import socket
from pathlib import Path

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


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range of ports for outgoing connections and port 0 (Linux's default if unread)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_run(count: int, floor: int = 10000) -> int:
    """The first of `count` consecutive free loopback ports, all below the kernel's ephemeral range.

    For a process that binds its ports minutes after they are chosen (the demo builds its images
    first): a port in the ephemeral range may meanwhile become the local port of any outgoing
    connection, or another free_port(), and the late bind fails with EADDRINUSE (a run's demo
    lost its SSH key page's port so).  Below that range only an explicit bind takes a port."""
    low, _ = ephemeral_range()
    if low - count <= floor:
        raise RuntimeError(f"no room below the ephemeral port range (starts at {low}) for {count} ports")
    for _ in range(200):
        base = random.randrange(floor, low - count)
        run = range(base, base + count)
        if not _handed_out.intersection(run) and all(_bindable(p) for p in run):
            _handed_out.update(run)
            return base
    raise RuntimeError(f"no {count} free ports in a row between {floor} and {low}")
