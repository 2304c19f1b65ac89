"""The spine, end to end: REST -> hub -> gpu-docker -> dockerd -> JupyterLab -> proxy."""

import requests

from devservices.waiting import until


def test_user_server_lifecycle_through_rest(make_hub, docker_client):
    hub = make_hub()
    hub.create_user("alice")

    server = hub.start_server("alice", {"profile": "tf-cpu"})
    assert server["ready"]

    # The single-user server answers through the proxy, with the user's own token.
    token = hub.user_token("alice")
    r = requests.get(f"{hub.url}/user/alice/api/status",
                     headers={"Authorization": f"token {token}"}, timeout=30)
    assert r.status_code == 200, r.text
    assert "started" in r.json()

    containers = hub.containers(docker_client)
    assert [c.name for c in containers] == [f"{hub.prefix}-alice"]
    assert containers[0].status == "running"

    hub.stop_server("alice")
    # Docker may still be removing it when the hub answers (its log: "Already removing
    # container"); a loaded machine showed it listed right after the 204.
    until(lambda: hub.containers(docker_client) == [], 60, "alice's container to be removed")
