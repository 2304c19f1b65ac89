"""Users' servers on the real multi-node Swarm (tests/fixtures/swarm.py) cannot reach each other.

amy probes, from inside her own task, bea's server on the other GPU node and cy's on her own
node: their Jupyter servers' version (by service name and by every address of their tasks)
and a secret line bea serves on another port.  A container on the servers' overlay that is
neither (a job's, say) probes bea's server too, and the relay that stands between the hub
and bea's server (engines/swarm/relay.py).  amy still reaches the hub through her environment's URL.
"""

from __future__ import annotations

import json

import pytest

from devservices.swarm_hub import profiles_config
from spawner.engines.swarm.relay import LABEL_SERVER_NET
from tests.fixtures.hub import wait_for
from tests.fixtures.swarm import docker

pytestmark = pytest.mark.integration

SECRET = "bea-secret-7c1e"
SECRET_PORT = 9999
# Run in a container: GET each URL ("$HUB": the container's own JUPYTERHUB_API_URL); print
# {name: first bytes of the answer, or "ERR <why>"}.
PROBE = """
import json, os, sys, urllib.request
out = {}
for name, url in json.loads(sys.argv[1]).items():
    url = os.environ.get("JUPYTERHUB_API_URL", "") if url == "$HUB" else url
    try:
        out[name] = urllib.request.urlopen(url, timeout=3).read().decode(errors="replace")[:300]
    except Exception as exc:
        out[name] = "ERR " + type(exc).__name__
print(json.dumps(out))
"""


def task_addresses(service: str) -> list[str]:
    """Every address of the service's running task, on each of its networks."""
    ids = docker("service", "ps", "-q", "--no-trunc", "--filter", "desired-state=running", service).split()
    info = json.loads(docker("inspect", ids[0]))[0]
    return [address.split("/")[0] for attachment in info.get("NetworksAttachments") or []
            for address in attachment.get("Addresses") or []]


def probe_from_task(swarm, service: str, targets: dict[str, str]) -> dict[str, str]:
    node, cid = wait_for(lambda: swarm.task_container(service), what=f"{service}'s task")
    return json.loads(node.docker("exec", cid, "python3", "-c", PROBE, json.dumps(targets), timeout=120))


def targets_of(hub, user: str, service: str) -> dict[str, str]:
    found = {f"{user} by name": f"http://{service}:8888/user/{user}/api"}
    for address in task_addresses(service):
        found[f"{user} at {address}"] = f"http://{address}:8888/user/{user}/api"
    return found


def test_a_users_server_cannot_reach_another_users_server_on_swarm(make_swarm_hub, swarm_cluster, notebook_image):
    hub = make_swarm_hub(profiles_config(notebook_image))
    users = {"amy": "a100", "bea": "t4", "cy": "a100"}  # bea on the other node, cy on amy's
    for user, profile in users.items():
        hub.create_user(user)
        hub.start_server(user, {"profile": profile})
    amy, bea, cy = (f"{hub.prefix}-{u}" for u in users)
    node, cid = wait_for(lambda: swarm_cluster.task_container(bea), what="bea's task")
    node.docker("exec", "-d", cid, "sh", "-c", f"mkdir -p /tmp/s && echo {SECRET} > /tmp/s/secret.txt && "
                f"exec python3 -m http.server {SECRET_PORT} --directory /tmp/s")
    # bea herself reads her secret (the listener runs), and her server answers on her own task.
    wait_for(lambda: SECRET in probe_from_task(swarm_cluster, bea, {"own": f"http://127.0.0.1:{SECRET_PORT}/secret.txt"})["own"],
             what="bea's secret listener")
    targets = {**targets_of(hub, "bea", bea), **targets_of(hub, "cy", cy),
               "bea's secret by name": f"http://{bea}:{SECRET_PORT}/secret.txt",
               **{f"bea's secret at {a}": f"http://{a}:{SECRET_PORT}/secret.txt" for a in task_addresses(bea)},
               "the hub": "$HUB"}
    seen = probe_from_task(swarm_cluster, amy, targets)
    hub_answer = seen.pop("the hub")
    assert '"version"' in hub_answer, hub_answer  # amy reaches the hub's API
    reached = {name: answer for name, answer in seen.items() if not answer.startswith("ERR")}
    assert reached == {}, f"amy's server reached other users' servers: {reached}"
    # A container on the servers' overlay that is not the hub gets nothing either: not bea's
    # task, and not the relay the hub reaches her server through (which answers the hub only).
    relays = json.loads(docker("inspect", f"{bea}-relay"))
    relay_ip = relays[0]["NetworkSettings"]["Networks"][swarm_cluster.network]["IPAddress"]
    outsider = {**targets_of(hub, "bea", bea), "bea's relay": f"http://{relay_ip}:8888/user/bea/api"}
    out = docker("run", "--rm", "--network", swarm_cluster.network, "--label",
                 f"org.jupyter.gpuhub.swarm-harness={swarm_cluster.session}", "--entrypoint", "python3",
                 notebook_image, "-c", PROBE, json.dumps(outsider), timeout=120)
    reached = {name: answer for name, answer in json.loads(out).items() if not answer.startswith("ERR")}
    assert reached == {}, f"a container on the servers' overlay reached bea's server: {reached}"
    # The hub itself still reaches bea's server (its readiness and the proxy's route use the relay).
    assert hub.server_model("bea")["ready"]
    print("bea's relay uses", docker("stats", "--no-stream", "--format", "{{.MemUsage}}", f"{bea}-relay"))
    # A stopped server's relay goes at once, its own overlay once its task is gone.
    own = ("network", "ls", "-q", "--filter", f"label={LABEL_SERVER_NET}={bea}")
    assert docker(*own) != "", "bea's server has no overlay of its own"
    hub.stop_server("bea")
    print([line for line in hub.log_tail(200).splitlines() if "bea's server exited" in line])
    assert docker("ps", "-aq", "--filter", f"name=^{bea}-relay$") == ""
    wait_for(lambda: docker(*own) == "", 90, "bea's own overlay to be removed", hub)
