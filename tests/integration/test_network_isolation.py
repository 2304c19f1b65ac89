"""Users' containers do not talk to each other, nor to the host beyond what they need.

A real hub, dockerd and the host's own rules (spawner/engines/common/firewall.py), on a bridge of the
test's own (the hub makes it, as in production).  Two users' servers and two cluster jobs (one
on an internal network, one whose profile has `job_network`) probe, from inside their
containers, each other's listening ports, the hub's API and the gpu-pool service on the
bridge's gateway, another port of this host and the cloud metadata address.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import socket

import pytest

from ..fixtures.hub import Hub, wait_for
from .test_gpu_spawner import container_of
from .test_jobs import job, job_containers, job_hub, submit

# Run inside a container: each argument host:port -> "open", "refused", "blocked" (the host's
# rules answer "administratively prohibited"), "timeout" or "no name"; `http://...` arguments
# -> the HTTP status of a GET.
PROBE = r"""
import errno, json, socket, sys, urllib.request
out = {}
for target in sys.argv[1:]:
    if target.startswith("http"):
        try:
            out[target] = urllib.request.urlopen(target, timeout=5).status
        except urllib.error.HTTPError as e:
            out[target] = e.code
        except Exception as e:
            out[target] = type(e).__name__
        continue
    host, port = target.rsplit(":", 1)
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect((host, int(port)))
        out[target] = "open"
    except socket.gaierror:
        out[target] = "no name"
    except socket.timeout:
        out[target] = "timeout"
    except OSError as e:
        out[target] = {errno.ECONNREFUSED: "refused", errno.EHOSTUNREACH: "blocked",
                       errno.ENETUNREACH: "blocked"}.get(e.errno, errno.errorcode.get(e.errno, str(e)))
    finally:
        s.close()
print(json.dumps(out))
"""

METADATA = "169.254.169.254:80"


def probe(container, *targets: str) -> dict:
    code, out = container.exec_run(["python3", "-c", PROBE, *targets], user="0")
    assert code == 0, out.decode(errors="replace")
    return json.loads(out.decode().strip().splitlines()[-1])


def address(container, network: str) -> str:
    container.reload()
    return container.attrs["NetworkSettings"]["Networks"][network]["IPAddress"]


@pytest.fixture
def own_network(docker_client):
    """The name of a bridge this test's hub makes; removed afterwards (its hub's cleanup
    withdrew its host rules)."""
    name = f"gpuhub-iso-{secrets.token_hex(3)}"
    yield name
    with contextlib.suppress(Exception):
        docker_client.networks.get(name).remove()


@pytest.fixture
def host_listener():
    """A TCP port of this host that listens on every address (the kernel completes the handshake)."""
    sock = socket.socket()
    sock.bind(("0.0.0.0", 0))
    sock.listen(16)
    yield sock.getsockname()[1]
    sock.close()


def running_cluster(hub: Hub, docker_client, token: str, profile: str) -> tuple[dict, list]:
    """A two-worker cluster of `profile` whose workers each listen on TensorFlow's port 2222."""
    j = submit(hub, token, {"profile": profile, "workers": 2, "timeout": 600,
                            "command": ["python3", "-m", "http.server", "2222"]})
    wait_for(lambda: len([c for c in job_containers(hub, docker_client, j["id"]) if c.status == "running"]) == 2
             and job(hub, token, j["id"])["started_at"], timeout=120, hub=hub, what=f"cluster {j['id']} running")
    workers = sorted(job_containers(hub, docker_client, j["id"]), key=lambda c: c.name)
    # Each worker listens before anyone probes it.
    for worker in workers:
        wait_for(lambda w=worker: probe(w, "127.0.0.1:2222")["127.0.0.1:2222"] == "open", hub=hub,
                 what=f"{worker.name} listening")
    return j, workers


def test_servers_and_clusters_reach_the_hub_and_their_own_peers_only(own_network, make_hub, docker_client,
                                                                      host_listener):
    # tf-gpu-1 lets jobs out (job_network); tf-cpu's clusters stay on an internal network.
    hub, tokens = job_hub(make_hub, env={"GPUHUB_DOCKER_NETWORK": own_network}, users=("alice", "bob"),
                          extra_config="""
c.GPUDockerSpawner.profiles = [dict(p, job_network=True) if p["slug"] == "tf-gpu-1" else p
                               for p in c.GPUDockerSpawner.profiles]
""")
    gateway = docker_client.networks.get(own_network).attrs["IPAM"]["Config"][0]["Gateway"]
    hub_api = f"{gateway}:{hub.env['GPUHUB_HUB_PORT']}"
    pool_service = f"{gateway}:{hub.env['GPUHUB_POOL_PAGE_PORT']}"
    other_port = f"{gateway}:{host_listener}"
    hub.start_server("alice", {"profile": "tf-cpu"})
    hub.start_server("bob", {"profile": "tf-cpu"})
    alice, bob = container_of(hub, docker_client, "alice"), container_of(hub, docker_client, "bob")
    bob_server = f"{address(bob, own_network)}:8888"
    assert probe(bob, "127.0.0.1:8888")["127.0.0.1:8888"] == "open"  # bob's server listens

    outbound, (out0, out1) = running_cluster(hub, docker_client, tokens["bob"], "tf-gpu-1")
    internal, (in0, in1) = running_cluster(hub, docker_client, tokens["bob"], "tf-cpu")

    # Alice's server: the hub's API (an HTTP answer) and the gpu-pool service, nothing else.
    seen = probe(alice, bob_server, f"{out0.name}:2222", hub_api, f"http://{hub_api}/hub/api/", pool_service,
                 other_port, METADATA)
    assert seen[hub_api] == "open" and seen[f"http://{hub_api}/hub/api/"] == 200, seen
    assert seen[pool_service] == "open", seen
    assert seen[bob_server] != "open", f"alice reached bob's server: {seen}"
    assert seen[f"{out0.name}:2222"] != "open", f"alice reached bob's cluster's gRPC port: {seen}"
    assert seen[other_port] == "blocked", f"alice reached another port of the host: {seen}"
    assert seen[METADATA] != "open", seen

    # Its workers are on their cluster's own network only, never the hub's shared one.
    for worker in (out0, out1, in0, in1):
        worker.reload()
        assert own_network not in worker.attrs["NetworkSettings"]["Networks"], worker.attrs["NetworkSettings"]

    # A cluster that may go out: its peers, the hub's API; not the other users, not the host.
    out_gateway = out0.attrs["NetworkSettings"]["Networks"][f"{hub.prefix}-job-{outbound['id']}-net"]["Gateway"]
    seen = probe(out0, f"{out1.name}:2222", hub_api, f"{address(alice, own_network)}:8888", other_port,
                 f"{out_gateway}:{host_listener}", METADATA)
    assert seen[f"{out1.name}:2222"] == "open" and seen[hub_api] == "open", seen
    assert seen[f"{address(alice, own_network)}:8888"] != "open", f"a worker reached alice's server: {seen}"
    assert seen[other_port] == "blocked" and seen[f"{out_gateway}:{host_listener}"] == "blocked", seen
    assert seen[METADATA] != "open", seen

    # An internal cluster: its peers, and nothing on the host through its gateway.
    in_gateway = in0.attrs["NetworkSettings"]["Networks"][f"{hub.prefix}-job-{internal['id']}-net"]["Gateway"]
    seen = probe(in0, f"{in1.name}:2222", hub_api, pool_service, f"{in_gateway}:{hub.env['GPUHUB_HUB_PORT']}",
                 f"{in_gateway}:{host_listener}")
    assert seen[f"{in1.name}:2222"] == "open", seen
    assert all(seen[t] != "open" for t in seen if t != f"{in1.name}:2222"), \
        f"an internal cluster reached the host: {seen}"

    # The doctor finds every rule in place, as the hub installed them.
    from spawner.cli.doctor import OK, Doctor, target_from_env

    doctor = Doctor(target_from_env("root", env=hub.env))
    doctor.docker = docker_client
    doctor.check_host_rules()
    assert [(r.check, r.status) for r in doctor.results] == [("host rules", OK)], doctor.results

    # The servers still work through the hub (its proxy reaches them).
    r = hub.api("GET", "/users/alice", token=tokens["alice"])
    assert r.status_code == 200 and r.json()["servers"][""]["ready"]
