"""gpu-swarm on a real multi-node Docker Swarm (tests/fixtures/swarm.py): one cluster per session.

Two GPU workers (Docker-in-Docker dockerds) with 2 simulated GPUs each; the
NVIDIA runtime double on each records the NVIDIA_VISIBLE_DEVICES every
container it created was given, which is what a real GPU node's runtime
would expose.  The hub runs on the overlay; the ledger is PostgreSQL.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import requests

from devservices.swarm_hub import profiles_config  # noqa: F401 (the Swarm test modules import it from here)
from tests.fixtures.hub import DUMMY_PASSWORD, wait_for
from tests.fixtures.swarm import docker, in_parallel

pytestmark = pytest.mark.integration

GPU1 = {"profile": "tf-gpu-1"}
CPU = {"profile": "tf-cpu"}


def lease_of(hub, user: str) -> dict:
    state = hub.api("GET", f"/users/{user}").json()["servers"][""]["state"]
    return state


def service_name(hub, user: str) -> str:
    return f"{hub.prefix}-{user}"


def seen_by_runtime(swarm, hub, user: str) -> tuple[str, str]:
    """(node hostname, NVIDIA_VISIBLE_DEVICES the runtime saw) for the user's running task."""
    node, cid = wait_for(lambda: swarm.task_container(service_name(hub, user)), what=f"{user}'s task")
    return node.hostname, wait_for(lambda: node.visible_devices().get(cid), what="the runtime's record")


def test_gpus_lent_across_both_nodes_exactly_as_leased(make_swarm_hub, swarm_cluster):
    hub = make_swarm_hub()
    users = ["ann", "ben", "cid", "dan"]
    for user in users + ["cpu1"]:
        hub.create_user(user)
    in_parallel(hub.start_server, *[(u, GPU1) for u in users], ("cpu1", CPU))
    seen = {}
    for user in users:
        hub.wait_ready(user)
        state = lease_of(hub, user)
        node, visible = seen_by_runtime(swarm_cluster, hub, user)
        # The task ran on the node the ledger chose and saw exactly the leased GPU.
        assert node == state["gpu_host"]
        assert visible == ",".join(state["gpu_uuids"])
        seen[user] = (node, visible)
    assert len({v for _, v in seen.values()}) == 4, seen  # no GPU lent twice
    assert {n for n, _ in seen.values()} == {n.hostname for n in swarm_cluster.nodes}
    # A CPU server sees no GPU, although nvidia is its node's default runtime, and runs locked down.
    assert seen_by_runtime(swarm_cluster, hub, "cpu1")[1] == "void"
    status = in_task(swarm_cluster, hub, "cpu1", "grep -E '^(NoNewPrivs|CapEff|Uid)' /proc/self/status")
    fields = {line.split(":")[0]: line.split(":")[1].split() for line in status.splitlines()}
    assert fields["NoNewPrivs"] == ["1"]
    assert fields["CapEff"] == ["0000000000000000"]
    assert fields["Uid"][0] != "0"
    in_parallel(hub.stop_server, *[(u,) for u in users])
    # Every GPU comes back once Swarm reports its task gone (on a loaded node that can be
    # after the stop's 10 s grace: then the stop's background watch releases it).
    wait_for(lambda: hub.ledger().leases() == [], 120, "every lease ended once its task is gone", hub)
    assert {lease.end_reason for lease in hub.ledger().history() if lease.user in users} == {"stopped"}




def in_task(swarm, hub, user: str, script: str) -> str:
    node, cid = wait_for(lambda: swarm.task_container(service_name(hub, user)), what=f"{user}'s task")
    return node.docker("exec", cid, "sh", "-c", script)


def test_queue_across_the_cluster_and_tagged_profiles(make_swarm_hub, swarm_cluster, notebook_image):
    hub = make_swarm_hub(profiles_config(notebook_image))
    a100 = next(n for n in swarm_cluster.nodes if n.labels["gpu.model"] == "a100")
    for user in ("t1", "t2", "t3", "t4", "t5"):
        hub.create_user(user)
    # A tag-restricted profile lands only on nodes with that label.
    hub.start_server("t1", {"profile": "a100"})
    hub.start_server("t2", {"profile": "a100"})
    assert {lease_of(hub, u)["gpu_host"] for u in ("t1", "t2")} == {a100.hostname}
    # The spawn form counts each profile's own GPUs: none of the A100s is free, both T4s are.
    session = requests.Session()
    session.get(f"{hub.url}/hub/login", timeout=30)
    session.post(f"{hub.url}/hub/login", timeout=30, data={
        "username": "t3", "password": DUMMY_PASSWORD, "_xsrf": session.cookies.get("_xsrf")})
    form = session.get(f"{hub.url}/hub/spawn", timeout=30).text
    assert "1 A100</strong> <span class=\"gpu-availability\">(1 GPU(s); 0 of 2 free now)" in form, form
    assert "1 T4</strong> <span class=\"gpu-availability\">(1 GPU(s); 2 of 2 free now)" in form, form
    # The A100 node is full: a third A100 request queues although the other node has free GPUs.
    r = hub.api("POST", "/users/t3/server", json={"profile": "a100"})
    assert r.status_code == 202, r.text
    wait_for(lambda: [w for w in hub.ledger().queue() if w.user == "t3"], what="t3 in the queue")
    in_parallel(hub.start_server, ("t4", GPU1), ("t5", GPU1))  # the cluster's 4 GPUs are now lent
    assert lease_of(hub, "t4")["gpu_host"] != a100.hostname
    hub.stop_server("t1")
    hub.wait_ready("t3")
    state = lease_of(hub, "t3")
    assert state["gpu_host"] == a100.hostname
    leases = hub.ledger().leases()
    assert len(leases) == 4
    assert len({(l.host, u) for l in leases for u in l.gpu_uuids}) == 4  # no GPU lent twice


# In a server's task: its own in-lab GPU status (gpuhub_activity), asked as its JupyterLab asks it.
OWN_LAB_STATUS = """python3 -c '
import json, os, urllib.parse, urllib.request
port = urllib.parse.urlparse(os.environ["JUPYTERHUB_SERVICE_URL"]).port or 8888
url = f"http://127.0.0.1:{port}" + os.environ["JUPYTERHUB_SERVICE_PREFIX"].rstrip("/") + "/gpuhub/status"
request = urllib.request.Request(url, headers={"Authorization": "token " + os.environ["JUPYTERHUB_API_TOKEN"]})
print(urllib.request.urlopen(request, timeout=30).read().decode())
'"""


def test_jupyterlabs_gpu_status_reaches_the_pool_service_over_the_overlay_with_jobs_off(
        make_swarm_hub, swarm_cluster, notebook_image):
    hub = make_swarm_hub(profiles_config(notebook_image), env={"GPUHUB_POOL_PAGE": "true", "GPUHUB_JOBS": "false"})
    from .test_poolpage import wait_for_page

    hub.create_user("pat")
    wait_for_page(hub, hub.user_token("pat"))
    hub.start_server("pat", {"profile": "a100"})
    state = lease_of(hub, "pat")
    # The server's task runs on a worker node: it reaches the service on the hub's overlay address
    # (without the listener there it answers {"available": false, "message": "... did not answer"}).
    status = json.loads(in_task(swarm_cluster, hub, "pat", OWN_LAB_STATUS))
    assert status["available"], status
    assert status["user"] == "pat" and status["jobs"] is None  # jobs are off
    assert [g["uuid"] for g in status["lease"]["gpus"]] == state["gpu_uuids"]
    assert status["lease"]["host"] == state["gpu_host"]


def test_home_follows_the_user_to_another_node(make_swarm_hub, swarm_cluster, notebook_image):
    hub = make_swarm_hub(profiles_config(notebook_image))
    hub.create_user("roamer")
    hub.start_server("roamer", {"profile": "a100"})
    in_task(swarm_cluster, hub, "roamer", "echo written-on-a100 > $HOME/note.txt")
    hub.stop_server("roamer")
    hub.start_server("roamer", {"profile": "t4"})
    assert in_task(swarm_cluster, hub, "roamer", "cat $HOME/note.txt; stat -c %u $HOME") .split() == [
        "written-on-a100", "1000"]
    hub.stop_server("roamer")


def test_drained_node_gets_nothing_new(make_swarm_hub, swarm_cluster):
    # With the generic-resource guard asked for: Swarm also reserves the GPUs where its managers can
    # carry it (Docker 23.0+); on older managers (Debian's 20.10 here) the hub leaves the reservation
    # out and says why, because those managers shut such tasks down at their node's next update.
    hub = make_swarm_hub("c.GPUSwarmSpawner.generic_resource_guard = True")
    from spawner.engines.swarm.generic_guard import verdict_of

    guard = verdict_of(json.loads(docker("node", "inspect", *docker("node", "ls", "-q").split())))
    drained = swarm_cluster.nodes[1]
    docker("node", "update", "--availability", "drain", drained.node_id)
    try:
        for user in ("d1", "d2"):
            hub.create_user(user)
        in_parallel(hub.start_server, ("d1", GPU1), ("d2", GPU1))
        assert {lease_of(hub, u)["gpu_host"] for u in ("d1", "d2")} == {swarm_cluster.nodes[0].hostname}
        for user in ("d1", "d2"):
            assert seen_by_runtime(swarm_cluster, hub, user)[1] == ",".join(lease_of(hub, user)["gpu_uuids"])
            spec = json.loads(docker("service", "inspect", service_name(hub, user)))[0]["Spec"]
            reserved = spec["TaskTemplate"]["Resources"].get("Reservations", {}).get("GenericResources")
            assert reserved == ([{"DiscreteResourceSpec": {"Kind": "GPU", "Value": 1}}] if guard.usable else None)
        if not guard.usable:
            assert hub.log_path.read_text().count("generic_resource_guard is on, but manager(s)") == 1
        hub.create_user("d3")
        r = hub.api("POST", "/users/d3/server", json=GPU1)
        assert r.status_code == 202, r.text
        wait_for(lambda: [w for w in hub.ledger().queue() if w.user == "d3"], what="d3 to queue")
        assert not [l for l in hub.ledger().leases() if l.host == drained.hostname]
        hub.api("DELETE", "/users/d3/server")
        hub.wait_stopped("d3")
    finally:
        docker("node", "update", "--availability", "active", drained.node_id)


def test_hub_sigkill_then_restart_reconciles_the_cluster(make_swarm_hub, swarm_cluster, notebook_image):
    from spawner.engines.common.labels import LABEL_GPUS, LABEL_HOST, LABEL_LEASE, LABEL_POOL, pool_identity

    hub = make_swarm_hub(extra_config="c.JupyterHub.cleanup_servers = False")
    hub.create_user("keeper")
    hub.start_server("keeper", GPU1)
    kept = lease_of(hub, "keeper")
    hub.kill()
    ledger = hub.ledger()
    # Left behind by a hub killed mid-spawn: a lease without a task ...
    node = swarm_cluster.node(next(n.hostname for n in swarm_cluster.nodes if n.hostname != kept["gpu_host"]))
    orphan = ledger.try_acquire("ghost", "", 1, host=node.hostname)
    assert orphan is not None
    # ... and a task holding a GPU without a lease; beside it, one of another hub's ledger.
    stray, foreign = f"{hub.prefix}-stray", f"{hub.prefix}-foreign"
    free = next(u for u in node.gpus if u not in orphan.gpu_uuids)
    for name, pool_id in ((stray, pool_identity(ledger)), (foreign, "another-ledger")):
        labels = {LABEL_LEASE: "999999", LABEL_POOL: pool_id, LABEL_GPUS: free, LABEL_HOST: node.hostname}
        flags = [arg for key, value in labels.items() for arg in ("--label", f"{key}={value}",
                                                                 "--container-label", f"{key}={value}")]
        docker("service", "create", "--detach", "--name", name, "--restart-condition", "none",
               "--constraint", f"node.hostname=={node.hostname}", *flags,
               "--entrypoint", "sleep", notebook_image, "600")
    wait_for(lambda: swarm_cluster.task_container(stray), what="the stray task to run")
    hub.start()
    wait_for(lambda: ledger.lease(orphan.id).end_reason == "reconciled", what="the orphan lease to end", hub=hub)
    wait_for(lambda: docker("service", "ls", "-q", "--filter", f"name={stray}") == "", what="the stray service to go")
    assert swarm_cluster.task_container(foreign), "another ledger's task was touched"
    # The server that kept running keeps its lease and answers.
    assert [l.id for l in ledger.leases()] == [kept["gpu_lease_id"]]
    assert hub.server_model("keeper")["ready"]
    hub.stop_server("keeper")
    # The quick stop reached the adopted server (engines/swarm/stopping.py): this hub process holds no
    # token of the server's, so it asked with one of keeper's made for it (and deleted after).
    log = hub.log_tail(400)
    assert "keeper's server exited" in log and "after it was asked to" in log, log[-4000:]


def test_a_quiet_worker_keeps_its_server_and_lease_and_a_dead_one_ends_them_after_the_grace(
        make_swarm_hub, swarm_cluster, notebook_image):
    grace = 40
    hub = make_swarm_hub(profiles_config(notebook_image) + f"\nc.GPUSwarmSpawner.node_down_grace = {grace}\n")
    victim = next(n for n in swarm_cluster.nodes if n.labels["gpu.model"] == "t4")
    hub.create_user("unlucky")
    hub.start_server("unlucky", {"profile": "t4"})
    lease_id = lease_of(hub, "unlucky")["gpu_lease_id"]

    def node_state() -> str:
        return docker("node", "inspect", "-f", "{{.Status.State}}", victim.node_id)

    # Cut off: its dockerd frozen (no heartbeats), its container still there.
    docker("pause", victim.container)
    try:
        wait_for(lambda: node_state() != "ready", timeout=90, what="Swarm to see the node quiet")
        problem = wait_for(lambda: hub.ledger().lease(lease_id).problem, timeout=30,
                           what="the lease to show the quiet node", hub=hub)
        assert victim.hostname in problem and "kept" in problem, problem
        # The server and its lease are kept, its GPU not lent; `gpu-pool status` says why.
        assert hub.server_model("unlucky") is not None
        assert hub.ledger().lease(lease_id).ended_at is None
        status = subprocess.run([sys.executable, "-m", "spawner.cli", "status", "--db-url", hub.pool_db_url],
                                capture_output=True, text=True, timeout=60)
        assert f"node {victim.hostname} is" in status.stdout and "kept" in status.stdout, (status.stdout,
                                                                                          status.stderr)
    finally:
        docker("unpause", victim.container, check=False)
    wait_for(lambda: node_state() == "ready", timeout=90, what="the node back")
    wait_for(lambda: not hub.ledger().lease(lease_id).problem, timeout=30, what="the problem cleared", hub=hub)
    assert hub.server_model("unlucky")["ready"] and hub.ledger().lease(lease_id).ended_at is None

    # Dead for good: after the grace period the lease ends (`died`).
    docker("kill", victim.container)
    try:
        wait_for(lambda: hub.server_model("unlucky") is None, timeout=grace + 120, what="the server to be gone",
                 hub=hub)
        wait_for(lambda: hub.ledger().lease(lease_id).end_reason == "died", timeout=60, what="the lease to end")
        # The down node's GPUs are not lent: a request only it could meet is refused, saying so.
        r = hub.api("POST", "/users/unlucky/server", json={"profile": "t4"})
        assert r.status_code == 400 and victim.hostname in r.json()["message"], r.text
        assert {g.state for g in hub.ledger().gpus() if g.gpu.host == victim.hostname} == {"missing"}
        assert hub.ledger().leases() == []
    finally:
        docker("start", victim.container, check=False)
