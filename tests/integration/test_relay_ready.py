"""A Swarm relay or job proxy is waited for until it listens (engines/swarm/relay.py's
`wait_ready`), on the real dockerd with the relay's own program: fresh8's failure was a
cluster's worker whose first connection through its job's proxy was refused, the proxy started
but not yet listening."""

from __future__ import annotations

import asyncio
import contextlib
import secrets

import pytest

from spawner.engines.swarm import relay


def _call(client):
    async def call(method, *args, **kwargs):
        return await asyncio.to_thread(getattr(client.api, method), *args, **kwargs)
    return call


def _connects(box, port: int) -> str:
    probe = (f"import socket\ntry:\n socket.create_connection(('127.0.0.1', {port}), 2).close(); print('open')\n"
             "except OSError as e:\n print(type(e).__name__)")
    return box.exec_run(["python3", "-c", probe], user="65534:65534").output.decode().strip()


def test_a_relay_is_waited_for_until_it_listens_and_one_that_exits_says_why(docker_client, notebook_image):
    spec = {"forwards": [], "allow": [], "max_connections": 4, "proxy": relay.proxy_spec([], [])}
    program = relay.program_command(spec)
    tag = secrets.token_hex(3)
    # The relay's python3 slow to start, as on a busy manager: here it starts when told to.
    slow = docker_client.containers.run(
        notebook_image, ["-c", 'until [ -e /tmp/go ]; do sleep 0.1; done; exec "$@"', "relay", *program],
        entrypoint=["sh"], detach=True, name=f"gpuhub-relay-ready-{tag}", network_mode="none", user="65534:65534")
    broken = docker_client.containers.run(
        notebook_image, ["-c", "echo 'cannot bind: address in use' >&2; exit 3"], entrypoint=["sh"], detach=True,
        name=f"gpuhub-relay-broken-{tag}", network_mode="none", user="65534:65534")
    try:
        assert _connects(slow, relay.PROXY_PORT) == "ConnectionRefusedError"  # started, not listening
        with pytest.raises(relay.RelayNotReady, match="did not listen within 1 s"):
            asyncio.run(relay.wait_ready(_call(docker_client), slow.name, seconds=1))
        slow.exec_run(["touch", "/tmp/go"], user="65534:65534")
        asyncio.run(relay.wait_ready(_call(docker_client), slow.name))
        assert _connects(slow, relay.PROXY_PORT) == "open"

        with pytest.raises(relay.RelayNotReady) as raised:
            asyncio.run(relay.wait_ready(_call(docker_client), broken.name))
        assert "exited (3)" in str(raised.value) and "cannot bind: address in use" in str(raised.value)
    finally:
        for box in (slow, broken):
            with contextlib.suppress(Exception):
                box.remove(force=True)
