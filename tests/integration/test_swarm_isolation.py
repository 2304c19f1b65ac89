"""On Swarm, users' servers do not talk to each other (swarm/server_networks.py).

Two users' servers on the harness's real Swarm, one on each worker node: bea's server
listens (its Jupyter server on 8888, and a listener of her own on 9999 that answers a
known line); amy's server tries to reach them by bea's service name and by every address
bea's task has, and must get no answer of hers, while it still reaches the hub's API by the
hub's name.  Connects alone prove nothing here (a connection to any 10.x address completes in
some sandboxes, and an HTTP proxy may answer it): the probe reads what answers.

In the "swarm" work unit (tests/conftest.py): one worker runs it with the other Swarm
modules; by hand, under `flock /tmp/gpuhub-exclusive.lock`.
"""

from __future__ import annotations

import json

import pytest

from tests.fixtures.hub import wait_for
from tests.fixtures.swarm import docker, in_parallel

from .test_swarm import lease_of, profiles_config, service_name

pytestmark = pytest.mark.integration

SECRET = "bea-secret-7f3a"

# Run in bea's task: answer every connection to port 9999 with SECRET.
LISTENER = f"""
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 9999))
s.listen(8)
while True:
    c, _ = s.accept()
    c.sendall(b"{SECRET}\\n")
    c.close()
"""

# Run in a task: for each argument host:port[/path], what a GET of the path answered (its
# first 3000 characters), or why nothing did.
PROBE = r"""
import json, socket, sys
out = {}
for target in sys.argv[1:]:
    hostport, _, path = target.partition("/")
    host, port = hostport.rsplit(":", 1)
    try:
        s = socket.create_connection((host, int(port)), timeout=4)
    except OSError as e:
        out[target] = "no connection: " + type(e).__name__
        continue
    s.settimeout(4)
    got = b""
    try:
        s.sendall(("GET /" + path + " HTTP/1.0\r\nHost: " + host + "\r\n\r\n").encode())
        while len(got) < 4096:
            chunk = s.recv(4096)
            if not chunk:
                break
            got += chunk
    except OSError as e:
        got += ("<" + type(e).__name__ + ">").encode()
    finally:
        s.close()
    out[target] = got.decode(errors="replace")[:3000]
print(json.dumps(out))
"""


def task_of(swarm, hub, user: str):
    return wait_for(lambda: swarm.task_container(service_name(hub, user)), what=f"{user}'s task")


def probe(swarm, hub, user: str, *targets: str) -> dict:
    node, cid = task_of(swarm, hub, user)
    out = node.docker("exec", cid, "python3", "-c", PROBE, *targets, timeout=120)
    return json.loads(out.splitlines()[-1])


def task_addresses(hub, user: str) -> list[str]:
    """Every address bea's running task has, on any network."""
    ids = docker("service", "ps", "-q", "--no-trunc", "--filter", "desired-state=running",
                 service_name(hub, user)).split()
    task = json.loads(docker("inspect", ids[0]))[0]
    return [a.split("/")[0] for att in task.get("NetworksAttachments") or [] for a in att.get("Addresses") or []]


def test_a_users_server_cannot_reach_another_users_server_on_swarm(make_swarm_hub, swarm_cluster, notebook_image):
    hub = make_swarm_hub(profiles_config(notebook_image))
    for name in ("amy", "bea"):
        hub.create_user(name)
    # One server on each worker: the overlay carries them across nodes.
    in_parallel(hub.start_server, ("amy", {"profile": "a100"}), ("bea", {"profile": "t4"}))
    assert lease_of(hub, "amy")["gpu_host"] != lease_of(hub, "bea")["gpu_host"]

    node, cid = task_of(swarm_cluster, hub, "bea")
    node.docker("exec", "-d", cid, "python3", "-c", LISTENER)
    wait_for(lambda: SECRET in probe(swarm_cluster, hub, "bea", "127.0.0.1:9999")["127.0.0.1:9999"],
             what="bea's listener answering in her own server", hub=hub)
    # Bea's Jupyter server answers its API (a JSON "version") to her.
    jupyter_api = "8888/user/bea/api"
    assert '"version"' in probe(swarm_cluster, hub, "bea", f"127.0.0.1:{jupyter_api}")[f"127.0.0.1:{jupyter_api}"]

    bea_name = service_name(hub, "bea")
    bea_hosts = [bea_name, *task_addresses(hub, "bea")]
    hub_api = f"{hub.env['GPUHUB_HUB_CONNECT_IP']}:{hub.env['GPUHUB_HUB_PORT']}/hub/api/"
    targets = [f"{h}:{port}" for h in bea_hosts for port in (jupyter_api, 9999)] + [hub_api]
    seen = probe(swarm_cluster, hub, "amy", *targets)

    # Amy still reaches the hub's API, by the hub's name...
    assert '"version"' in seen[hub_api], seen
    # ...and nothing of bea's, by name or by any of her addresses.
    for target in targets[:-1]:
        assert SECRET not in seen[target] and '"version"' not in seen[target], f"amy reached bea at {target}: {seen}"

    # Both servers still work through the hub's proxy.
    for name in ("amy", "bea"):
        r = hub.api("GET", f"/users/{name}")
        assert r.status_code == 200 and r.json()["servers"][""]["ready"], r.text

    # A stopped server's own network goes with it.
    in_parallel(hub.stop_server, ("amy",), ("bea",))
    wait_for(lambda: not docker("network", "ls", "-q", "--filter", f"name={hub.prefix}-", check=False),
             timeout=60, what="the servers' own networks removed", hub=hub)
