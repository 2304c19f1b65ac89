"""gpu-swarm on a real multi-node Docker Swarm (tests/fixtures/swarm.py): one cluster per session.

Two GPU workers (Docker-in-Docker dockerds) with 2 simulated GPUs each; the
NVIDIA runtime double on each records the NVIDIA_VISIBLE_DEVICES every
container it created was given, which is what a real GPU node's runtime
would expose.  The hub runs on the overlay; the ledger is PostgreSQL.
"""

from __future__ import annotations

import signal
import threading
import time

import pytest

from tests.fixtures.hub import wait_for
from tests.fixtures.swarm import docker

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
    for user in users:
        hub.create_user(user)
    threads = [threading.Thread(target=hub.start_server, args=(u, GPU1)) for u in users]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
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
    for user in users:
        hub.stop_server(user)
    assert hub.ledger().leases() == []
