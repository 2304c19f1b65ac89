"""The SSH gateway's limits as an attacker meets them: the guessing throttle's keys and count,
connections that never log in, IPv6 sources, a burst of channel opens.

The connection-level test runs the real gateway (asyncssh) with JupyterHub's own
SharedPasswordAuthenticator and real asyncssh clients from several loopback addresses;
a wrong password never reaches the hub, so no hub is needed.
"""

from __future__ import annotations

import asyncio
import time

import asyncssh
import pytest
from jupyterhub.authenticators.shared import SharedPasswordAuthenticator

from spawner.ssh.gateway import Connection, Gateway
from spawner.ssh.gateway_settings import SSHGateway
from spawner.ssh.hub_client import HubClient
from spawner.ssh.key_store import KeyStore
from spawner.ssh.logins import Logins
from spawner.ssh.throttle import FailureThrottle, source_key

from ..fixtures.services import free_port

PASSWORD = "the-shared-password-1"


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def _gateway(tmp_path, **options) -> Gateway:
    settings = SSHGateway(host_key_dir=str(tmp_path / "host_keys"), **options).values()
    authenticator = SharedPasswordAuthenticator(user_password=PASSWORD, allow_all=True)
    hub = HubClient(url="http://127.0.0.1:9/hub/api", token="unused", timeout=2)
    store = KeyStore(tmp_path, settings["max_keys_per_user"], settings["max_key_bytes"], settings["min_rsa_bits"])
    return Gateway(settings, tmp_path, Logins(authenticator, hub, store, 2), hub)


def _arrival(gateway: Gateway, address: str) -> tuple[Connection, bool]:
    c = Connection(gateway)
    c.source, c.source_group = address, source_key(address)
    return c, gateway.admit(c)


def test_the_attempt_after_the_third_failure_is_slowed():
    # Attempts a fraction of a second apart, as a client makes them: the three failures have
    # faded a hair by the fourth attempt, which must still wait.
    clock = Clock()
    t = FailureThrottle(free=3, delay=0.5, max_delay=4.0, window=300.0, capacity=100, clock=clock)
    waits = []
    for _ in range(6):
        clock.now += 0.3
        waits.append(t.wait_for("source:a", "account:alice"))
        t.failed("source:a", "account:alice")
    assert waits == [0, 0, 0, 0.5, 1.0, 2.0]
    # A failure counts until it has faded out entirely: 6 failures, three windows later, are
    # still 3 (slowed); a fourth window later, 2 (free again).
    clock.now += 3 * 300.0
    assert t.wait_for("source:a") == 0.5
    clock.now += 300.0
    assert t.wait_for("source:a") == 0


@pytest.mark.parametrize("address, group", [
    ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
    ("2001:db8:1:2:ffff:ffff:ffff:ffff", "2001:db8:1:2::/64"),
    ("::ffff:192.0.2.7", "192.0.2.7"),
    ("192.0.2.7", "192.0.2.7"),
    ("fe80::1%eth0", "fe80::/64"),
])
def test_sources_are_grouped_ipv6_by_its_64(address, group):
    assert source_key(address) == group


def test_one_ipv6_64_holds_no_more_unauthenticated_connections_than_one_address(tmp_path):
    gateway = _gateway(tmp_path, max_unauthenticated_per_source=10)
    admitted = [_arrival(gateway, f"2001:db8:1:2::{i:x}")[1] for i in range(1, 16)]
    assert admitted == [True] * 10 + [False] * 5
    # Another /64 is another source.
    assert _arrival(gateway, "2001:db8:1:3::1")[1]


def test_idle_connections_from_a_few_addresses_do_not_lock_others_out(tmp_path):
    # The old lock-out: 20 addresses x 10 connections that never log in filled all 200 places.
    gateway = _gateway(tmp_path, max_connections=200, max_unauthenticated=50, max_unauthenticated_per_source=10)
    for source in range(20):
        for _ in range(10):
            _arrival(gateway, f"198.51.100.{source}")
    assert sum(gateway.unauthenticated.values()) <= 50
    # Someone from an address of their own still gets a connection to log in with ...
    newcomer, admitted = _arrival(gateway, "203.0.113.9")
    assert admitted and newcomer in gateway.connections
    # ... and the places of connections that logged in stay theirs.
    assert len(gateway.connections) <= 50
    assert gateway.settings["max_connections"] - len(gateway.connections) >= 150


def test_the_unauthenticated_budget_must_be_below_max_connections():
    with pytest.raises(Exception, match="max_unauthenticated .* below"):
        SSHGateway(max_connections=20, max_unauthenticated=20).values()


def test_a_burst_of_channel_opens_gets_no_more_than_the_limit(tmp_path):
    # asyncssh calls session_requested for each open of a burst before any channel is made.
    gateway = _gateway(tmp_path, max_channels_per_connection=4)
    c, _ = _arrival(gateway, "192.0.2.1")
    c.name = "alice"
    opened, refused = [], []
    for i in range(7):
        try:
            if i % 2:
                forward = c.connection_requested("localhost", 8888, "127.0.0.1", 5000)
                forward.close()  # never run here: the slot it holds stays counted
                opened.append(forward)
            else:
                opened.append(c.session_requested())
        except asyncssh.ChannelOpenError as refusal:
            refused.append(refusal.reason)
    assert len(opened) == 4 and len(refused) == 3
    assert all("max_channels_per_connection = 4" in r for r in refused)


async def _try_password(port: int, username: str, local: str) -> float:
    began = time.monotonic()
    with pytest.raises(asyncssh.PermissionDenied):
        await asyncssh.connect("127.0.0.1", port, username=username, password="wrong-" + PASSWORD,
                               known_hosts=None, client_keys=None, agent_path=None, config=[],
                               preferred_auth="password", local_addr=(local, 0), login_timeout=60)
    return time.monotonic() - began


def test_other_spellings_of_a_name_share_its_failure_count_and_the_fourth_attempt_waits(tmp_path):
    # Each attempt from its own address, so only the account's count can slow it down.
    delay = 3.0
    gateway = _gateway(tmp_path, address="127.0.0.1", port=free_port(), free_failures=3,
                       failure_delay=delay, max_failure_delay=delay)

    async def go():
        await gateway.start()
        try:
            port = gateway.settings["port"]
            fast = [await _try_password(port, name, f"127.0.0.{i + 2}")
                    for i, name in enumerate((" alice", "alice ", "Alice@example.com"))]
            slowed = await _try_password(port, "ALICE", "127.0.0.9")
            return fast, slowed
        finally:
            await gateway.stop()

    fast, slowed = asyncio.run(go())
    assert max(fast) < delay, fast
    assert slowed >= delay, (fast, slowed)
