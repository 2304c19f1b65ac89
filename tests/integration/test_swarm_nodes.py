"""The lock-down on every Swarm node, checked; placement that spends scarce GPUs last; a stop that
lets the server exit by itself before Swarm's slow task shutdown.  On the harness's real Swarm
(tests/fixtures/swarm.py; run under the machine-wide lock).

The harness's Docker (20.10, API 1.41) cannot carry no-new-privileges in a service spec, so
each node's daemon must enforce it: the two workers do (`--no-new-privileges`); a third one
added here does not, and the hub must place no server there, while `gpu-pool doctor` on the
manager names it with the fix.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from devservices.swarm import REPO, add_node, remove_node
from devservices.swarm_hub import profiles_config
from tests.fixtures.hub import wait_for
from tests.fixtures.swarm import docker

from .test_jobs import jobs_api, submit, wait_state
from .test_poolpage import wait_for_page

pytestmark = pytest.mark.integration

K80 = """
c.GPUDockerSpawner.profiles = c.GPUDockerSpawner.profiles + [
    {{"slug": "k80", "display_name": "1 K80", "image": {image!r}, "gpus": 1, "node_labels": {{"gpu.model": "k80"}}}},
]
"""


def task_container(swarm, hub, user: str):
    return wait_for(lambda: swarm.task_container(f"{hub.prefix}-{user}"), what=f"{user}'s task")


def doctor_nodes(hub) -> dict[str, dict]:
    """`gpu-pool doctor --json` run on the manager with the hub's settings: node checks by name."""
    env = {**hub.env, "GPUHUB_INVENTORY": "swarm"}
    proc = subprocess.run([sys.executable, "-m", "spawner.cli", "doctor", "--json", "--config", str(hub.config_file)],
                          capture_output=True, text=True, timeout=180, env=env)
    results = json.loads(proc.stdout)
    return {r["check"].removeprefix("node "): r for r in results if r["check"].startswith("node ")}


def test_servers_run_without_new_privileges_and_a_lax_node_gets_none(make_swarm_hub, swarm_cluster,
                                                                      notebook_image):
    lax = add_node(swarm_cluster, 3, {"gpu.model": "k80", "gpu.memory": "12g"}, no_new_privileges=False)
    try:
        hub = make_swarm_hub(profiles_config(notebook_image) + K80.format(image=notebook_image),
                             env={"GPUHUB_POOL_PAGE": "true"})
        for user in ("nn1", "nn2", "nn3", "nn4"):
            hub.create_user(user)
        # A GPU server on a worker whose daemon enforces it: its process has NoNewPrivs set.
        hub.start_server("nn1", {"profile": "a100"})
        node, cid = task_container(swarm_cluster, hub, "nn1")
        assert node.hostname != lax.hostname
        status = node.docker("exec", cid, "grep", "NoNewPrivs", "/proc/1/status")
        assert status.split() == ["NoNewPrivs:", "1"], status
        # The profile that only the lax node serves is refused, naming the node and why.
        code, message = hub.refused_spawn("nn2", {"profile": "k80"})
        assert "no-new-privileges" in message and lax.hostname in message, message
        assert not [lease for lease in hub.ledger().leases() if lease.host == lax.hostname]
        # Plain GPU and CPU servers never land on it, though its two GPUs are free.
        hub.start_server("nn3", {"profile": "tf-gpu-1"})
        hub.start_server("nn4", {"profile": "tf-cpu"})
        for user in ("nn3", "nn4"):
            assert task_container(swarm_cluster, hub, user)[0].hostname != lax.hostname
        spec = json.loads(docker("service", "inspect", f"{hub.prefix}-nn4"))[0]["Spec"]
        assert f"node.id!={lax.node_id}" in spec["TaskTemplate"]["Placement"]["Constraints"]
        # Jobs follow the same check: one only the lax node could run is refused, naming it and why;
        # a CPU job's service may run anywhere but there.
        token = hub.user_token("nn2")
        wait_for_page(hub, token)
        r = jobs_api(hub, "POST", "", token, json={"profile": "k80", "command": ["true"]})
        assert r.status_code == 409 and "no-new-privileges" in r.text and lax.hostname in r.text, r.text
        cpu_job = submit(hub, token, {"profile": "tf-cpu", "command": ["sh", "-c", "sleep 600"]})
        service = f"{hub.prefix}-job-{cpu_job['id']}"  # made once the job leaves the queue
        [found] = wait_for(lambda: json.loads(docker("service", "inspect", service, check=False) or "[]"), what=service)
        spec = found["Spec"]
        assert f"node.id!={lax.node_id}" in spec["TaskTemplate"]["Placement"]["Constraints"]
        assert jobs_api(hub, "DELETE", f"/{cpu_job['id']}", token).status_code in (200, 202, 204)
        wait_state(hub, token, cpu_job["id"], ("cancelled", "failed"), timeout=120)
        # The doctor on the manager lists every node: the lax one FAILs, with the fix.
        nodes = doctor_nodes(hub)
        assert nodes[lax.hostname]["status"] == "FAIL", nodes
        assert "no-new-privileges" in nodes[lax.hostname]["fix"]
        for worker in swarm_cluster.nodes:
            if worker is not lax:
                assert nodes[worker.hostname]["status"] in ("ok", "warn"), nodes[worker.hostname]
                assert "enforces no-new-privileges" in nodes[worker.hostname]["detail"]
        for user in ("nn1", "nn3", "nn4"):
            hub.stop_server(user)
    finally:
        remove_node(swarm_cluster, lax)


DEMO_PROFILES = """
c.GPUDockerSpawner.profiles = [
    {{"slug": "tf-gpu-1", "display_name": "1 GPU", "image": {image!r}, "gpus": 1}},
    {{"slug": "a100", "display_name": "1 A100", "image": {image!r}, "gpus": 1, "node_labels": {{"gpu.model": "a100"}}}},
]
"""


def test_plain_gpu_servers_leave_the_tagged_nodes_gpus_to_their_profile(make_swarm_hub, swarm_cluster,
                                                                         notebook_image):
    # As in `make demo-swarm`: only the `a100` profile names a node; plain servers can go anywhere.
    hub = make_swarm_hub(profiles_config(notebook_image) + DEMO_PROFILES.format(image=notebook_image))
    a100 = next(n for n in swarm_cluster.nodes if n.labels.get("gpu.model") == "a100")
    for user in ("p1", "p2", "p3"):
        hub.create_user(user)
    hub.start_server("p1", {"profile": "tf-gpu-1"})
    hub.start_server("p2", {"profile": "tf-gpu-1"})
    hosts = {lease.user: lease.host for lease in hub.ledger().leases()}
    assert a100.hostname not in (hosts["p1"], hosts["p2"]), hosts
    # The next A100 request is served at once instead of queueing behind plain servers.
    hub.start_server("p3", {"profile": "a100"})
    assert {lease.user: lease.host for lease in hub.ledger().leases()}["p3"] == a100.hostname
    for user in ("p1", "p2", "p3"):
        hub.stop_server(user)


def test_a_stopped_server_exits_by_itself_before_swarm_signals_it(make_swarm_hub, swarm_cluster):
    hub = make_swarm_hub()
    hub.create_user("quick")
    hub.start_server("quick", {"profile": "tf-gpu-1"})
    node, cid = task_container(swarm_cluster, hub, "quick")
    since = node.docker("info", "--format", "{{.SystemTime}}")
    hub.stop_server("quick")
    assert hub.ledger().leases() == []
    # The worker's own record of the container's end: it exited with 0 after Jupyter's
    # shutdown, and Swarm never had to send it a signal (a `kill` event).
    events = wait_for(lambda: (out := node.docker("events", "--since", since, "--until", "0s", "--filter",
                                                  f"container={cid}",
                                                  "--format", "{{.Action}} {{json .Actor.Attributes}}"))
                      and "destroy" in out and out, what="the container's events")
    actions = [line.split(" ", 1)[0] for line in events.splitlines()]
    assert "kill" not in actions, events
    die = next(json.loads(line.split(" ", 1)[1]) for line in events.splitlines() if line.startswith("die "))
    assert die["exitCode"] == "0", events


KILLED_SESSION = """
import sys, time
from devservices.swarm import start_swarm
swarm = start_swarm(session=sys.argv[1])
print("ready", flush=True)
time.sleep(3600)
"""


def test_a_swarm_left_by_a_killed_session_is_removed_by_the_next_start(swarm_cluster):
    """pytest killed by SIGKILL (or SIGTERM) runs no teardown: its Swarm's workers, nodes, volumes
    and overlay stay.  The next start_swarm removes them (their owner no longer runs) and leaves
    the live session's Swarm alone."""
    from devservices.swarm import HARNESS_LABEL, remove_abandoned

    session = "killed" + swarm_cluster.session[:4]
    owner = subprocess.Popen([sys.executable, "-c", KILLED_SESSION, session], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=str(REPO))
    try:
        assert owner.stdout.readline().strip() == "ready", owner.stderr.read()[-2000:]
    finally:
        owner.kill()
        owner.wait(timeout=30)

    def left() -> dict[str, list[str]]:
        label = f"label={HARNESS_LABEL}={session}"
        return {"containers": docker("ps", "-aq", "--filter", label).split(),
                "volumes": docker("volume", "ls", "-q", "--filter", label).split(),
                "networks": docker("network", "ls", "-q", "--filter", label).split(),
                "nodes": docker("node", "ls", "-q", "--filter", f"node.label=gpuhub.test-session={session}").split()}

    before = left()
    assert len(before["containers"]) == 2 and len(before["nodes"]) == 2 and before["networks"], before
    assert session in remove_abandoned()
    assert left() == {"containers": [], "volumes": [], "networks": [], "nodes": []}
    assert not list(Path("/var/tmp").glob(f"gpuhub-swarm-{session}-*"))
    # The live session's Swarm is as it was: its workers run and are ready, and it is still a swarm.
    assert all(node.running() for node in swarm_cluster.nodes)
    assert all(docker("node", "inspect", "-f", "{{.Status.State}}", n.node_id) == "ready" for n in swarm_cluster.nodes)
    assert session not in remove_abandoned() and swarm_cluster.session not in remove_abandoned()
