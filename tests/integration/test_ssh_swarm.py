"""SSH into one's own server on the real multi-node Docker Swarm (tests/fixtures/swarm.py): the
gateway runs with the hub on the overlay and reaches the sshd in the user's task, wherever the
Swarm placed it.  Uses the session's Swarm: run under the machine's exclusive lock."""

from __future__ import annotations

import pytest

from tests.fixtures.hub import DUMMY_PASSWORD, wait_for
from tests.fixtures.ssh import SSHClient, ssh_env, wait_for_gateway

pytestmark = pytest.mark.integration


def test_ssh_and_scp_reach_the_users_task_on_a_worker_node(make_swarm_hub, swarm_cluster, tmp_path):
    env = ssh_env()
    hub = make_swarm_hub(env=env, start=False)
    hub.env["GPUHUB_SSH_ADDRESS"] = hub.address  # the helper's bridge address, which this test reaches
    hub.start()
    port = int(env["GPUHUB_SSH_PORT"])
    wait_for_gateway(port, hub, host=hub.address)
    hub.create_user("sam")
    hub.start_server("sam", {"profile": "tf-gpu-1"})
    node, cid = wait_for(lambda: swarm_cluster.task_container(f"{hub.prefix}-sam"), what="sam's task")
    client = SSHClient(port, tmp_path / "ssh", host=hub.address)

    r = client.ssh("sam", "hostname; pwd; echo $NVIDIA_VISIBLE_DEVICES", password=DUMMY_PASSWORD)
    assert r.returncode == 0, r.stderr + hub.log_tail(60)
    hostname, pwd, visible = r.stdout.split()
    assert cid.startswith(hostname)  # the task's own container, on a worker node
    assert node.hostname in {n.hostname for n in swarm_cluster.nodes}
    state = hub.api("GET", "/users/sam").json()["servers"][""]["state"]
    assert visible == ",".join(state["gpu_uuids"])  # the GPU the ledger lent, in the SSH session too

    local = tmp_path / "data.csv"
    local.write_text("a,b\n1,2\n")
    r = client.scp("sam", local, "data.csv", password=DUMMY_PASSWORD)
    assert r.returncode == 0, r.stderr
    assert node.docker("exec", cid, "cat", f"{pwd}/data.csv") == "a,b\n1,2"
