"""devservices.ports.free_port_run: ports chosen long before they are bound stay out of the
kernel's ephemeral range, where any outgoing connection could take one meanwhile."""

from __future__ import annotations

import socket

import pytest

from devservices import ports

pytestmark = pytest.mark.unit


def test_a_run_of_ports_is_free_consecutive_below_the_ephemeral_range_and_never_handed_out_twice():
    low, _ = ports.ephemeral_range()
    first = ports.free_port_run(8)
    assert first >= 10000 and first + 8 <= low
    for port in range(first, first + 8):  # each one can be bound now
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
    runs = [ports.free_port_run(8) for _ in range(20)]
    taken = [p for base in [first, *runs] for p in range(base, base + 8)]
    assert len(taken) == len(set(taken))  # no port in two runs


def test_a_run_that_holds_a_port_in_use_is_passed_over(monkeypatch):
    first = ports.free_port_run(12)
    held = first + 3  # a listener on a port below the range, as another demo's would be
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", held))
        listener.listen()
        tries = iter([first, first + 4])  # the first try covers the held port, the second does not
        monkeypatch.setattr(ports.random, "randrange", lambda a, b: next(tries))
        ports._handed_out.difference_update(range(first, first + 12))
        assert ports.free_port_run(8) == first + 4


def test_no_room_below_the_range_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (10004, 60999))
    with pytest.raises(RuntimeError, match="no room below the ephemeral port range"):
        ports.free_port_run(8)
