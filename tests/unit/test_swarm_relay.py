"""The relay that keeps Swarm servers apart (engines/swarm/relay.py): its environment rewriting, its
spec, and its program, run here as the relay runs it (`python3 -c`), on loopback."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time

import pytest

from spawner.engines.swarm import relay

pytestmark = pytest.mark.unit

ENV = {
    "JUPYTERHUB_API_URL": "http://10.0.1.5:8081/hub/api",
    "JUPYTERHUB_ACTIVITY_URL": "http://10.0.1.5:8081/hub/api/users/amy/activity",
    "GPUHUB_POOL_URL": "http://10.0.1.5:8002/services/gpu-pool/",
    "JUPYTERHUB_SERVICE_URL": "http://0.0.0.0:8888/user/amy/",
    "OTHER": "http://10.0.1.55:9000/ and 10.0.1.5 as text",
}


def test_the_servers_hub_urls_name_the_relay_and_nothing_else_changes():
    assert relay.hub_ports(ENV, "10.0.1.5") == [8002, 8081]
    out = relay.through_relay(ENV, "10.0.1.5")
    assert out["JUPYTERHUB_API_URL"] == "http://jupyterhub:8081/hub/api"
    assert out["GPUHUB_POOL_URL"] == "http://jupyterhub:8002/services/gpu-pool/"
    assert out["JUPYTERHUB_SERVICE_URL"] == ENV["JUPYTERHUB_SERVICE_URL"]
    assert out["OTHER"] == ENV["OTHER"]  # another address that starts alike, and bare text, stay
    assert relay.through_relay({"U": "http://gpuhub-hub:8081/x"}, "gpuhub-hub") == {"U": "http://jupyterhub:8081/x"}


def test_the_spec_forwards_the_servers_ports_from_the_hub_only_and_refuses_a_clash():
    spec = relay.relay_spec("gpuhub-amy", [8888, 2222], "gpuhub-hub", [8081])
    assert spec["allow"] == ["gpuhub-hub"]
    assert spec["forwards"] == [
        {"listen": 8888, "host": "gpuhub-amy", "port": 8888, "check": True},
        {"listen": 2222, "host": "gpuhub-amy", "port": 2222, "check": True},
        {"listen": 8081, "host": "gpuhub-hub", "port": 8081, "check": False},
    ]
    with pytest.raises(ValueError, match="8081"):
        relay.relay_spec("gpuhub-amy", [8081], "gpuhub-hub", [8081])


def test_the_proxy_spec_refuses_every_nodes_address_and_names_the_relay_in_the_servers_environment():
    nodes = [{"Status": {"Addr": "172.17.0.1"}, "ManagerStatus": {"Addr": "172.17.0.1:2377"}},
             {"Status": {"Addr": "172.17.0.3"}}, {"Status": {"Addr": "0.0.0.0"}},
             {"Status": {}, "ManagerStatus": {"Addr": "[fd00::5]:2377"}}]
    proxy = relay.proxy_spec(nodes, ["10.20.0.0/24"])
    assert proxy == {"listen": relay.PROXY_PORT, "refuse": ["172.17.0.1", "172.17.0.3", "fd00::5"],
                     "allow": ["10.20.0.0/24"]}
    spec = relay.relay_spec("gpuhub-amy", [8888], "gpuhub-hub", [8081], proxy)
    assert spec["proxy"] == proxy
    with pytest.raises(ValueError, match="3128"):
        relay.relay_spec("gpuhub-amy", [3128], "gpuhub-hub", [8081], proxy)
    env = relay.proxy_env("http://jupyterhub:3128")
    assert env["HTTPS_PROXY"] == env["https_proxy"] == "http://jupyterhub:3128"
    assert "jupyterhub" in env["NO_PROXY"].split(",") and "HTTP_PROXY" not in env


def test_created_age_reads_dockers_times():
    now = 1_800_000_000.0
    assert relay.created_age(now - 40, now) == pytest.approx(40)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now - 90)) + ".123456789Z"
    assert relay.created_age(stamp, now) == pytest.approx(90)
    local = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now - 90 + 3600)) + ".5+01:00"
    assert relay.created_age(local, now) == pytest.approx(90)
    assert relay.created_age("garbage", now) == 0.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _echo_server() -> int:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def serve():
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=lambda c=conn: [c.sendall(b"echo:" + d) for d in iter(lambda: c.recv(100), b"")]
                             and c.close(), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[1]


def _ask(port: int, source: str) -> bytes:
    """What comes back for b"hi" from `source` (b"": closed or reset, nothing forwarded)."""
    data = b""
    with socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0)) as s:
        try:
            s.sendall(b"hi")
            s.shutdown(socket.SHUT_WR)
            while chunk := s.recv(100):
                data += chunk
        except OSError:  # reset, or not connected any more: the relay closed it
            pass
    return data


def test_the_relay_program_forwards_only_the_hubs_connections_to_the_server():
    server, hub = _echo_server(), _echo_server()
    to_server, to_hub = _free_port(), _free_port()
    spec = {"forwards": [{"listen": to_server, "host": "127.0.0.1", "port": server, "check": True},
                         {"listen": to_hub, "host": "127.0.0.1", "port": hub, "check": False}],
            "allow": ["127.0.0.1"], "max_connections": 4}
    proc = subprocess.Popen([sys.executable, "-c", relay.RELAY_PROGRAM, json.dumps(spec)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "relay ready"
        assert _ask(to_server, "127.0.0.1") == b"echo:hi"  # the hub's address
        assert _ask(to_server, "127.0.0.2") == b""  # any other: closed, nothing forwarded
        assert _ask(to_hub, "127.0.0.2") == b"echo:hi"  # the server's way to the hub
    finally:
        proc.kill()
        proc.wait()


class FakeManager:
    """The few APIClient calls relay.sweep makes, over lists of services, containers, networks."""

    def __init__(self, services, containers, networks, busy=()):
        self._services, self.containers_, self.networks_, self.busy = services, containers, networks, set(busy)
        self.removed: list[str] = []

    def services(self):
        return [{"Spec": {"Name": name}} for name in self._services]

    def containers(self, all=True, filters=None):
        return list(self.containers_)

    def networks(self, filters=None):
        return list(self.networks_)

    def remove_container(self, cid, force=False):
        self.removed.append(cid)

    def remove_network(self, nid):
        import docker.errors

        if nid in self.busy:
            raise docker.errors.APIError("network is in use by task")
        self.removed.append(nid)


def test_the_sweep_removes_only_what_a_gone_server_left_and_is_old_enough():
    now = time.time()
    old, young = now - 120, now - 5
    stamp = lambda t: time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + ".1Z"  # noqa: E731
    api = FakeManager(
        services=["gpuhub-amy"],
        containers=[{"Id": "r-amy", "Created": old, "Labels": {relay.LABEL_RELAY: "gpuhub-amy"}},
                    {"Id": "r-bea", "Created": old, "Labels": {relay.LABEL_RELAY: "gpuhub-bea"}},
                    {"Id": "r-new", "Created": young, "Labels": {relay.LABEL_RELAY: "gpuhub-new"}}],
        networks=[{"Id": "n-amy", "Name": "gpuhub-amy-net", "Created": stamp(old),
                   "Labels": {relay.LABEL_SERVER_NET: "gpuhub-amy"}},
                  {"Id": "n-bea", "Name": "gpuhub-bea-net", "Created": stamp(old),
                   "Labels": {relay.LABEL_SERVER_NET: "gpuhub-bea"}},
                  {"Id": "n-cy", "Name": "gpuhub-cy-net", "Created": stamp(old),
                   "Labels": {relay.LABEL_SERVER_NET: "gpuhub-cy"}},
                  {"Id": "n-new", "Name": "gpuhub-new-net", "Created": stamp(young),
                   "Labels": {relay.LABEL_SERVER_NET: "gpuhub-new"}}],
        busy={"n-cy"})
    relay.sweep(api, "pool", min_age=30)
    # amy's server runs, new's start may still be making its service, cy's task still shuts down.
    assert api.removed == ["r-bea", "n-bea"]


def _connect_through(port: int, target: str, request: bytes | None = None) -> tuple[bytes, bytes]:
    """(the proxy's answer line, what b"hi" then brings back) for CONNECT `target`."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(request or f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head and (chunk := s.recv(1)):
            head += chunk
        echoed = b""
        if head.startswith(b"HTTP/1.1 200"):
            s.sendall(b"hi")
            s.shutdown(socket.SHUT_WR)
            while chunk := s.recv(100):
                echoed += chunk
        return head.split(b"\r\n", 1)[0], echoed


def test_the_relays_proxy_connects_only_where_it_may():
    echo, port = _echo_server(), _free_port()
    spec = {"forwards": [], "allow": [], "max_connections": 4,
            "proxy": {"listen": port, "refuse": ["127.0.0.3"], "allow": ["127.0.0.0/30"]}}
    proc = subprocess.Popen([sys.executable, "-c", relay.RELAY_PROGRAM, json.dumps(spec)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "relay ready"
        # An allowed network (a lab's mirror): connected, and bytes flow both ways.
        assert _connect_through(port, f"127.0.0.1:{echo}") == (b"HTTP/1.1 200 Connection established", b"echo:hi")
        assert _connect_through(port, f"localhost:{echo}")[0].startswith(b"HTTP/1.1 200")
        assert _connect_through(port, f"[::1]:{echo}")[0].startswith(b"HTTP/1.1 403")  # IPv6 loopback: not allowed
        # Refused before any connection: the metadata address, a node's address (even inside
        # an allowed network), a private address outside the allowed ones.
        assert _connect_through(port, "169.254.169.254:80")[0].startswith(b"HTTP/1.1 403 Refused: a link-local")
        node_refused = b"HTTP/1.1 403 Refused: an address of a Swarm node"
        assert _connect_through(port, f"127.0.0.3:{echo}")[0].startswith(node_refused)
        assert _connect_through(port, "10.1.2.3:443")[0].startswith(b"HTTP/1.1 403 Refused: not a public address")
        assert _connect_through(port, "[::ffff:169.254.169.254]:80")[0].startswith(b"HTTP/1.1 403")
        # Only CONNECT; garbage is a 400.
        plain_get = b"GET http://127.0.0.1:%d/ HTTP/1.1\r\n\r\n" % echo
        assert _connect_through(port, "", plain_get)[0].startswith(b"HTTP/1.1 405")
        assert _connect_through(port, "", b"CONNECT nonsense HTTP/1.1\r\n\r\n")[0].startswith(b"HTTP/1.1 400")
    finally:
        proc.kill()
        proc.wait()
