"""Servers on borrowed GPUs (issue 38), on the real hub, pool service, ledger and Docker: a server
whose profile may borrow takes idle GPUs beyond its user's share; JupyterLab (its own status
endpoint, what the GPU panel polls), api/lab and api/wait say so; a server within its share
asks for them; the borrowed server's user is told first (the panel's notice with the time left,
a `reclaimed` notification in the outbox), then the server is stopped like a cull once
`reclaim_grace` is over, its lease ends `reclaimed` once its container is gone, and the waiting
server gets the GPUs.  A profile that does not borrow, and a borrow over the limit, are refused
with a 403 naming the rule, taking nothing.

Three simulated GPUs; alice's share is 1 (the per-user limit), bob's 2 (group `ml`); a short
`reclaim_grace` comes through configuration.  Every wait is on observable state."""

from __future__ import annotations

import json
import time

from spawner.pool.ledger import outbox

from ..fixtures.hub import wait_for
from .test_gpu_spawner import container_of
from .test_poolpage import page_api, wait_for_page

GRACE = 15
BORROWING = f"""
c.GPUPool.max_gpus_per_user = 1
c.GPUPool.group_gpu_limits = {{"ml": 2}}
c.GPUPool.reclaim_grace = {GRACE}
c.GPUPool.max_borrowed_gpus_per_user = 2
c.GPUDockerSpawner.profiles = list(c.GPUDockerSpawner.profiles) + [
    {{"slug": "lab-borrow-2", "display_name": "JupyterLab + 2 GPUs (may borrow)", "gpus": 2, "borrow": True,
      "image": c.GPUDockerSpawner.profiles[0]["image"]}},
    {{"slug": "lab-borrow-3", "display_name": "JupyterLab + 3 GPUs (may borrow)", "gpus": 3, "borrow": True,
      "image": c.GPUDockerSpawner.profiles[0]["image"]}}]
"""
NOTICE = f"running on borrowed GPUs: may be reclaimed with {GRACE} seconds' notice"
# In alice's container: her server's own in-lab GPU status (gpuhub_activity), as JupyterLab asks it.
OWN_LAB_STATUS = """
import json, os, urllib.parse, urllib.request
port = urllib.parse.urlparse(os.environ["JUPYTERHUB_SERVICE_URL"]).port or 8888
url = f"http://127.0.0.1:{port}" + os.environ["JUPYTERHUB_SERVICE_PREFIX"].rstrip("/") + "/gpuhub/status"
request = urllib.request.Request(url, headers={"Authorization": "token " + os.environ["JUPYTERHUB_API_TOKEN"]})
print(urllib.request.urlopen(request, timeout=30).read().decode())
"""


def lab(hub, token: str) -> dict:
    r = page_api(hub, "GET", "api/lab", token)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_borrowed_server_gives_its_gpus_to_a_server_within_its_share_after_its_notice(make_hub, docker_client):
    hub = make_hub(BORROWING, env={"GPUHUB_SIMULATED_GPUS": "3", "GPUHUB_LEASE_WAIT_TIMEOUT": "300"})
    for user in ("alice", "bob"):
        hub.create_user(user)
    assert hub.api("POST", "/groups/ml", json={"users": ["bob"]}).status_code == 201
    alice = hub.user_token("alice")
    wait_for_page(hub, alice)

    # Hostile: beyond her share on a profile that does not borrow, and over the borrowing limit.
    r = hub.api("POST", "/users/alice/server", json={"profile": "tf-gpu-2"})
    assert r.status_code == 403, r.text
    message = r.json()["message"]
    assert "at most 1 GPU" in message and "Profile 'tf-gpu-2' does not borrow" in message, message
    r = hub.api("POST", "/users/alice/server", json={"profile": "lab-borrow-3"})
    assert r.status_code == 403 and "GPUPool.max_borrowed_gpus_per_user" in r.json()["message"], r.text
    r = hub.api("POST", "/users/alice/server", json={"profile": "lab-borrow-2", "borrow": False})
    assert r.status_code == 400 and "only 'profile' may be chosen" in r.json()["message"], r.text
    assert hub.ledger().leases() == [] and hub.server_model("alice") is None  # refusals took nothing

    # A profile that may borrow: 2 of the 3 idle GPUs, a borrowed lease, told in JupyterLab.
    ready = hub.start_server("alice", {"profile": "lab-borrow-2"})
    state = ready["state"]
    lease = hub.ledger().lease(state["gpu_lease_id"])
    assert lease.borrowed and lease.reclaim_at is None and len(lease.gpu_uuids) == 2
    assert state["gpu_borrowed"] is True
    assert lab(hub, alice)["lease"]["borrowed"] == {"notice": NOTICE, "reclaim_at": None, "stops_at": None,
                                                    "seconds_left": None}
    assert page_api(hub, "GET", "api/wait", alice).json()["borrowed"]["alice"]["notice"] == NOTICE
    code, out = container_of(hub, docker_client, "alice").exec_run(["python3", "-c", OWN_LAB_STATUS])
    assert code == 0, out
    assert json.loads(out)["lease"]["borrowed"]["notice"] == NOTICE
    assert {g["uuid"] for g in page_api(hub, "GET", "api/gpus", alice).json()["gpus"]
            if g.get("borrowed")} == set(lease.gpu_uuids)

    # bob, within his share of 2, asks for 2: one is free, alice's borrowed lease is asked back.
    asked_for = time.monotonic()
    r = hub.api("POST", "/users/bob/server", json={"profile": "tf-gpu-2"}, timeout=60)
    assert r.status_code in (201, 202), r.text
    asked = wait_for(lambda: hub.ledger().lease(lease.id).reclaim_at, 60, "the borrowed lease asked back", hub)
    # Told first: the panel says when her server stops; a `reclaimed` notification is queued.
    told = wait_for(lambda: (b := lab(hub, alice)["lease"]["borrowed"])["stops_at"] and b, 30,
                    "alice's panel telling the reclaim", hub)
    assert "this server is stopped at" in told["notice"] and 0 < told["seconds_left"] <= GRACE, told
    events = hub.ledger()._store.read(lambda conn: outbox.entries(conn, "alice"))
    reclaimed = [e for e in events if e["event"] == "reclaimed"]
    assert reclaimed and reclaimed[0]["payload"]["server_name"] == "" and reclaimed[0]["payload"]["gpus"] == 2
    assert hub.server_model("alice")["ready"]  # not stopped within the notice

    # After the grace: alice's server stopped like a cull, its lease reclaimed, bob's server ready.
    bob = hub.wait_ready("bob", timeout=GRACE + 90)
    waited = time.monotonic() - asked_for
    print(f"\nbob's server ready {waited:.1f} s after his request (reclaim_grace {GRACE} s)")
    hub.wait_stopped("alice", timeout=30)
    ended = hub.ledger().lease(lease.id)
    assert ended.end_reason == "reclaimed" and ended.ended_at >= asked
    assert (ended.ended_at - asked).total_seconds() >= GRACE - 1  # the notice was given in full
    assert not [c for c in hub.containers(docker_client) if c.name == f"{hub.prefix}-alice"]
    assert set(bob["state"]["gpu_uuids"]) & set(lease.gpu_uuids) and len(bob["state"]["gpu_uuids"]) == 2
    assert waited < GRACE + 60, waited
