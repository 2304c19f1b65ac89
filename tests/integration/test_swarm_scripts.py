"""Action scripts on the harness's real Swarm: a script runs in servers on both workers, each
as its own user, through each server's Jupyter server (no `docker exec` reaches a worker).

In the "swarm" work unit (tests/conftest.py): one worker runs it with the other Swarm modules;
by hand, under `flock /tmp/gpuhub-exclusive.lock`.
"""

from __future__ import annotations

import pytest

from tests.fixtures.swarm import in_parallel

from .test_poolpage import ADMIN_ENV, page_api, wait_for_page
from .test_swarm import lease_of, profiles_config

pytestmark = pytest.mark.integration


def test_a_script_runs_in_servers_on_both_workers_as_their_users(make_swarm_hub, swarm_cluster, notebook_image):
    hub = make_swarm_hub(profiles_config(notebook_image), env={**ADMIN_ENV, "GPUHUB_POOL_PAGE": "true"})
    for name in ("pat", "bob", "ada"):
        hub.create_user(name)
    ada = hub.user_token("ada")
    wait_for_page(hub, ada)
    in_parallel(hub.start_server, ("pat", {"profile": "a100"}), ("bob", {"profile": "t4"}))
    hosts = {lease_of(hub, u)["gpu_host"] for u in ("pat", "bob")}
    assert hosts == {n.hostname for n in swarm_cluster.nodes}  # one server on each worker

    script = "echo ran as $JUPYTERHUB_USER uid $(id -u) on $(hostname); echo visible=$NVIDIA_VISIBLE_DEVICES"
    r = page_api(hub, "POST", "api/exec", ada, json={"script": script, "users": ["pat", "bob"], "timeout": 30})
    assert r.status_code == 200, r.text
    results = {x["server"]: x for x in r.json()["results"]}
    for user in ("pat", "bob"):
        res = results[user]
        assert res["exit_code"] == 0, res
        assert f"ran as {user} uid 1000" in res["output"], res  # the server's own user, never root
        assert f"visible={lease_of(hub, user)['gpu_uuids'][0]}" in res["output"], res

    # The time limit and the output cap hold on a worker too.
    r = page_api(hub, "POST", "api/exec", ada, json={
        "script": "head -c 1000000 /dev/zero | tr '\\0' x; echo; sleep 30", "users": ["bob"], "timeout": 2})
    [res] = r.json()["results"]
    assert res["timed_out"] and res["exit_code"] == 124 and res["truncated"] and len(res["output"]) == 16 * 1024
    in_parallel(hub.stop_server, ("pat",), ("bob",))
