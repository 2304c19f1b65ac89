"""Users' servers on the real multi-node Swarm (tests/fixtures/swarm.py) cannot reach each other.

amy probes, from inside her own task, bea's server on the other GPU node and cy's on her own
node: their Jupyter servers' version (by service name and by every address of their tasks)
and a secret line bea serves on another port.  A container on the servers' overlay that is
neither (a job's, say) probes bea's server too, and the relay that stands between the hub
and bea's server (engines/swarm/relay.py).  amy still reaches the hub through her environment's URL.

dan's server has no route out (its own overlay is internal): not 169.254.169.254, no port of its
node or the manager, only the hub through its relay and, through the relay's HTTPS proxy, an
address the admin allowed (a "mirror").
"""

from __future__ import annotations

import json

import pytest

from devservices.swarm_hub import profiles_config
from spawner.engines.swarm.relay import JOB_PROXY_ALIAS, LABEL_JOB_PROXY, LABEL_SERVER_NET
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


# Run in a container: whether it has a default route, then per target "route IP" (does the
# kernel have a route to IP: a UDP connect, which sends nothing), "get URL" ("$HUB": its own
# JUPYTERHUB_API_URL) or "connect HOST:PORT" (a CONNECT through its HTTPS_PROXY: the answer's
# status line); {name: answer, or "ERR <why>"}.
NET_PROBE = r"""
import json, os, socket, sys, urllib.request
routes = [line.split() for line in open("/proc/net/route").read().splitlines()[1:]]
out = {"a default route": "yes" if any(r[1] == "00000000" for r in routes) else "ERR none"}
for name, target in json.loads(sys.argv[1]).items():
    kind, _, where = target.partition(" ")
    try:
        if kind == "route":
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((where, 80))
                out[name] = "route from " + s.getsockname()[0]
        elif kind == "get":
            url = os.environ.get("JUPYTERHUB_API_URL", "") if where == "$HUB" else where
            out[name] = urllib.request.urlopen(url, timeout=3).read().decode(errors="replace")[:300]
        else:
            host, port = os.environ["HTTPS_PROXY"].split("//")[1].rstrip("/").rsplit(":", 1)
            with socket.create_connection((host, int(port)), timeout=5) as c:
                c.sendall(("CONNECT %s HTTP/1.1\r\n\r\n" % where).encode())
                head = b""
                while b"\r\n\r\n" not in head and len(head) < 2000:
                    chunk = c.recv(1)
                    if not chunk:
                        break
                    head += chunk
                out[name] = head.decode(errors="replace").split("\r\n")[0]
                if kind == "tunnel" and " 200 " in out[name]:  # then HTTP through the tunnel
                    c.sendall(b"GET /secret.txt HTTP/1.0\r\n\r\n")
                    body = b""
                    while True:
                        chunk = c.recv(4096)
                        if not chunk:
                            break
                        body += chunk
                    out[name] += " | " + body.decode(errors="replace").strip().splitlines()[-1]
    except Exception as exc:
        out[name] = "ERR %s %s" % (type(exc).__name__, getattr(exc, "errno", "") or "")
print(json.dumps(out))
"""
# A cluster ends when its chief exits 0, and its other workers are then stopped (jobs/group.py):
# a worker still probing then prints nothing (fresh6 lost worker 1's line that way: it started
# later on another node).  So each other worker, once it has printed, waits for the chief to
# connect to it on PRINTED_PORT, and the chief prints last, after connecting to every one.
CLUSTER_PROBE = f"PROBE = {NET_PROBE!r}\nPRINTED_PORT = 7777\n" + r"""
import contextlib, io, json, os, socket, sys, time
config = json.loads(os.environ["TF_CONFIG"])
index, peers = config["task"]["index"], config["cluster"]["worker"]
printed = io.StringIO()
with contextlib.redirect_stdout(printed):
    exec(compile(PROBE, "probe", "exec"), {"__name__": "probe"})
if index == 0:
    deadline = time.monotonic() + 150
    for peer in peers[1:]:
        while time.monotonic() < deadline:
            try:
                socket.create_connection((peer.rsplit(":", 1)[0], PRINTED_PORT), timeout=2).close()
                break
            except OSError:
                time.sleep(0.5)
    sys.stdout.write(printed.getvalue())
else:
    sys.stdout.write(printed.getvalue())
    sys.stdout.flush()
    with socket.create_server(("", PRINTED_PORT)) as server:
        server.settimeout(150)
        with contextlib.suppress(OSError):
            server.accept()[0].close()
"""
NODE_SECRET = "node-secret-51ad"


def _serve_secret_on(address: str, secret: str = NODE_SECRET):
    """An HTTP listener of this machine (the manager node) on `address`, serving `secret`."""
    import http.server
    import threading

    class Secret(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(secret.encode())

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer((address, 0), Secret)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_swarm_server_reaches_neither_the_metadata_address_nor_any_nodes_services(
        make_swarm_hub, swarm_cluster, notebook_image):
    """dan's server on a GPU worker has no route out at all (none to 169.254.169.254) and gets
    nothing from a port listening on its node's own addresses (the worker's, its
    docker_gwbridge's) or the manager's, while the hub's API answers through the relay; the
    relay's HTTPS proxy refuses the same destinations and reaches a "mirror" on a network the
    admin allowed (`outbound_proxy_networks`).  The same from a container on the
    manager attached as a server's task there is (only to dan's own overlay: the harness's
    manager runs no servers, its dockerd does not enforce no-new-privileges), and from a job."""
    from .test_jobs import jobs_api, submit, wait_state
    from .test_poolpage import wait_for_page

    # A "mirror" on a network of the lab's that the admin lets the proxy reach: a listener on
    # the gateway of a bridge of its own on this machine (the manager).
    mirror_net = f"gpuhub-mirror-{swarm_cluster.session}"
    docker("network", "create", "--label", f"org.jupyter.gpuhub.swarm-harness={swarm_cluster.session}", mirror_net)
    [ipam] = json.loads(docker("network", "inspect", mirror_net))[0]["IPAM"]["Config"]
    mirror = _serve_secret_on(ipam["Gateway"], f"mirror-{NODE_SECRET}")
    # tf-gpu-1's jobs and clusters go out (job_network); t4's have no network.
    hub = make_swarm_hub(profiles_config(notebook_image)
                         + f"c.GPUSwarmSpawner.outbound_proxy_networks = [{ipam['Subnet']!r}]\n"
                         + "c.GPUDockerSpawner.profiles = [dict(p, job_network=True) if p['slug'] == 'tf-gpu-1' "
                           "else p for p in c.GPUDockerSpawner.profiles]\n",
                         env={"GPUHUB_POOL_PAGE": "true"})
    a100 = next(n for n in swarm_cluster.nodes if n.labels["gpu.model"] == "a100")
    port = 18931
    listener = f"gpuhub-node-listener-{swarm_cluster.session}"
    a100.docker("run", "-d", "--rm", "--name", listener, "--network", "host", "--entrypoint", "sh", notebook_image,
                "-c",
                f"mkdir -p /tmp/s && echo {NODE_SECRET} > /tmp/s/secret.txt && "
                f"exec python3 -m http.server {port} --directory /tmp/s")
    manager = _serve_secret_on(swarm_cluster.manager_addr)
    try:
        gwbridge = a100.docker("network", "inspect", "docker_gwbridge", "-f", "{{(index .IPAM.Config 0).Gateway}}")
        node_urls = {"the a100 node's own port": f"http://{a100.ip}:{port}/secret.txt",
                     "the a100 node's port on docker_gwbridge": f"http://{gwbridge}:{port}/secret.txt",
                     "the manager node's own port": f"http://{swarm_cluster.manager_addr}:{manager.server_port}/"}
        # The listeners run (the worker's seen from its own namespace).
        wait_for(lambda: NODE_SECRET in a100.docker("exec", listener, "python3", "-c",
                 f"import urllib.request; print(urllib.request.urlopen('http://{a100.ip}:{port}/secret.txt').read())",
                 check=False), what="the a100 node's listener")
        targets = {"a route to 169.254.169.254": "route 169.254.169.254",
                   **{name: f"get {url}" for name, url in node_urls.items()},
                   "the hub": "get $HUB",
                   "the proxy to 169.254.169.254": "connect 169.254.169.254:80",
                   "the proxy to the a100 node": f"connect {a100.ip}:{port}",
                   "the proxy to the manager": f"connect {swarm_cluster.manager_addr}:{manager.server_port}",
                   "the proxy to the relay's overlay address": "connect jupyterhub:8081"}

        def judge(who: str, seen: dict, hub_too: bool = True) -> None:
            print(who, seen)
            if hub_too:
                assert '"version"' in seen.pop("the hub"), seen  # the hub's API, through the relay
            # The allowed mirror, through the relay's proxy: connected, and HTTP through the tunnel.
            assert seen.pop("the mirror, through the proxy") == \
                f"HTTP/1.1 200 Connection established | mirror-{NODE_SECRET}", seen
            proxied = {name: seen.pop(name) for name in list(seen) if name.startswith("the proxy")}
            reached = {name: answer for name, answer in seen.items() if not answer.startswith("ERR")}
            assert reached == {}, f"{who} reached: {reached}"
            assert all(answer.startswith("HTTP/1.1 403 Refused") for answer in proxied.values()), proxied

        targets["the mirror, through the proxy"] = f"tunnel {ipam['Gateway']}:{mirror.server_port}"
        hub.create_user("dan")
        hub.start_server("dan", {"profile": "a100"})
        service = f"{hub.prefix}-dan"
        node, cid = wait_for(lambda: swarm_cluster.task_container(service), what="dan's task")
        assert node is a100
        env = dict(line.split("=", 1) for line in node.docker("exec", cid, "env").splitlines() if "=" in line)
        judge("dan's server", json.loads(node.docker("exec", cid, "python3", "-c", NET_PROBE, json.dumps(targets),
                                                     timeout=120)))
        # On the manager: a container attached as dan's task is, to his server's own overlay.
        [own] = docker("network", "ls", "-q", "--filter", f"label={LABEL_SERVER_NET}={service}").split()
        out = docker("run", "--rm", "--network", own, "--label",
                     f"org.jupyter.gpuhub.swarm-harness={swarm_cluster.session}",
                     *[a for key in ("JUPYTERHUB_API_URL", "HTTPS_PROXY") if key in env
                       for a in ("-e", f"{key}={env[key]}")],
                     "--entrypoint", "python3", notebook_image, "-c", NET_PROBE, json.dumps(targets), timeout=120)
        judge("a container on the manager on dan's overlay", json.loads(out))
        # A job (no job_network: an internal overlay of its own) reaches none of them either.
        token = hub.user_token("dan")
        wait_for_page(hub, token)
        job_targets = {name: target for name, target in targets.items()
                       if not target.startswith(("connect", "tunnel")) and name != "the hub"}
        job = submit(hub, token, {"profile": "t4", "command": ["python3", "-c", NET_PROBE, json.dumps(job_targets)]})
        done = wait_state(hub, token, job["id"], ("succeeded", "failed"), timeout=120)
        log = jobs_api(hub, "GET", f"/{job['id']}/logs", token).text
        assert done["state"] == "succeeded", log
        seen = json.loads(log.strip().splitlines()[-1])
        print("dan's job", seen)
        reached = {name: answer for name, answer in seen.items() if not answer.startswith("ERR")}
        assert reached == {}, f"dan's job reached: {reached}"
        # A job and a cluster whose profile has job_network: an internal overlay of their own
        # too, and out only through a proxy of its own, as a server.
        out_targets = {name: target for name, target in targets.items() if name != "the hub"}
        out_targets["the proxy to the relay's overlay address"] = f"connect {JOB_PROXY_ALIAS}:8081"
        for body in ({}, {"workers": 2}):
            probe = CLUSTER_PROBE if body else NET_PROBE
            job = submit(hub, token, {"profile": "tf-gpu-1", **body,
                                      "command": ["python3", "-c", probe, json.dumps(out_targets)]})
            done = wait_state(hub, token, job["id"], ("succeeded", "failed"), timeout=180)
            log = jobs_api(hub, "GET", f"/{job['id']}/logs", token).text
            assert done["state"] == "succeeded", log
            lines = [line[line.index("{"):] for line in log.splitlines() if '{"a default route"' in line]
            assert len(lines) == (body.get("workers") or 1), log
            for line in lines:
                judge(f"dan's job_network job {body}", json.loads(line), hub_too=False)
            wait_for(lambda: docker("ps", "-aq", "--filter", f"label={LABEL_JOB_PROXY}") == "", 60,
                     "the job's proxy to be removed", hub)
    finally:
        manager.shutdown()
        a100.docker("rm", "-f", listener, check=False)
        mirror.shutdown()
        docker("network", "rm", mirror_net, check=False)
