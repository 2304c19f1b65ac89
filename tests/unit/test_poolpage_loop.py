"""The gpu-pool service's event loop never waits on the hub: a token the service has not seen
is checked with the hub off the loop, within PoolServiceLimits.hub_auth_timeout, while every
other request is answered (the service's app on 127.0.0.1, a "hub" that accepts connections
and never answers; no real hub needed to freeze one).  A frozen dockerd: integration test
test_poolpage_frozen_docker.py."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import socket
import threading

import pytest
import requests

from devservices.waiting import until
from spawner.inventory import SimulatedInventory
from spawner.pool import GPUPool
from spawner.poolpage.limits import PoolServiceLimits

PREFIX = "/services/gpu-pool/"
KNOWN = "known-token"


@pytest.fixture
def frozen_hub():
    """A listening socket that takes connections and never answers (a hub stuck for good)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held = []
    stop = threading.Event()

    def accept():
        server.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(server.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}/hub/api", held
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


@pytest.fixture
def service(tmp_path, frozen_hub, monkeypatch):
    """The service's app (jobs off) on a free port, on a loop of its own thread."""
    monkeypatch.setenv("JUPYTERHUB_API_URL", frozen_hub[0])
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "service-token")
    monkeypatch.setenv("JUPYTERHUB_SERVICE_PREFIX", PREFIX)
    monkeypatch.setenv("JUPYTERHUB_SERVICE_NAME", "gpu-pool")
    monkeypatch.setenv("JUPYTERHUB_CLIENT_ID", "service-gpu-pool")
    from jupyterhub.services.auth import HubOAuth
    from tornado.httpserver import HTTPServer

    from spawner.poolpage.app import make_app

    HubOAuth.clear_instance()
    pool = GPUPool(inventory=SimulatedInventory(count=2, host="node-1"), db_url=f"sqlite:///{tmp_path}/l.sqlite")
    loop = asyncio.new_event_loop()
    started = threading.Event()
    port = {}

    def run():
        asyncio.set_event_loop(loop)
        app = make_app(pool, PREFIX, "/", False, limits=PoolServiceLimits(hub_auth_timeout=3))
        server = HTTPServer(app)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port["port"] = sock.getsockname()[1]
        sock.close()
        server.listen(port["port"], "127.0.0.1")
        auth = HubOAuth.instance()
        # A token the service already knows (its cache): answered without the hub.
        auth.cache[f"token::{hashlib.sha256(KNOWN.encode()).hexdigest()}"] = {
            "kind": "user", "name": "pat", "admin": False, "groups": [], "scopes": [
                "access:services!service=gpu-pool"]}
        started.set()
        loop.run_forever()
        server.stop()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    started.wait(10)
    yield f"http://127.0.0.1:{port['port']}{PREFIX}", frozen_hub[1]
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    pool.close()
    HubOAuth.clear_instance()


def wait_for(predicate, timeout=20.0, what=None):
    return until(predicate, timeout, what, interval=0.02)


def test_tokens_the_hub_has_not_answered_for_do_not_stop_other_requests(service):
    service, asked = service
    results = {}

    def unknown(i):
        results[i] = requests.get(service + "api/gpus", headers={"Authorization": f"token unknown-{i}"},
                                  timeout=30)

    callers = [threading.Thread(target=unknown, args=(i,)) for i in range(5)]
    for c in callers:
        c.start()
    wait_for(lambda: len(asked) >= 1)  # the service is asking the (frozen) hub about them
    # Meanwhile a known token is answered: the loop is not waiting on the hub.
    for _ in range(5):
        r = requests.get(service + "api/gpus", headers={"Authorization": f"token {KNOWN}"}, timeout=2)
        assert r.status_code == 200, r.text
    for c in callers:
        c.join()
    # Each unknown one gets told what happened, once the hub's time is up.
    for r in results.values():
        assert r.status_code == 503, r.text
        assert "The hub did not confirm who you are within 3 s" in r.json()["message"]
        assert "Traceback" not in r.text
