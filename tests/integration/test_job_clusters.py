"""Cluster jobs through the gpu-pool service, on a real hub, ledger and Docker (one host).

A cluster is one job of several containers (workers) that get all their GPUs at once or
wait holding none, find each other through TF_CONFIG on a network of their own, and end
together: the chief's exit 0 is success, any worker's failure ends them all.
"""

from __future__ import annotations

import time

from ..fixtures.hub import Hub, wait_for
from .test_gpu_spawner import visible_devices
from .test_jobs import job, job_containers, job_hub, jobs_api, submit, wait_state

def worker_leases(hub: Hub, job_id: int) -> list:
    return sorted((l for l in hub.ledger().history() if l.server_name.startswith(f"job/{job_id}/worker-")),
                  key=lambda l: l.server_name)


def cluster_networks(hub: Hub, docker_client, job_id: int) -> list:
    return docker_client.networks.list(names=[f"{hub.prefix}-job-{job_id}-net"])


HOSTILE_WORKERS = [
    (0, "between 1 and"), (-1, "between 1 and"), (1e9, "whole number"), (10**9, "JobLimits.max_workers"),
    ("2", "whole number"), ([2], "whole number"), (5, "JobLimits.max_workers"),
    (3, "can hold at most 2 such workers"),  # 3 x 2 GPUs: more than the pool's 4
]


def test_a_cluster_waits_holding_nothing_then_starts_whole_and_one_failure_ends_it(make_hub, docker_client):
    hub, tokens = job_hub(make_hub, env={"GPUHUB_SIMULATED_GPUS": "4"}, users=("pat", "bob"))
    pat = tokens["pat"]
    for workers, message in HOSTILE_WORKERS:
        r = jobs_api(hub, "POST", "", pat, json={"profile": "tf-gpu-2", "command": ["true"], "workers": workers})
        assert r.status_code == 400, (workers, r.text)
        assert message in r.json()["message"] and "Traceback" not in r.text, (workers, r.text)
    assert not hub.ledger().leases() and not hub.ledger().queue() and jobs_api(hub, "GET", "", pat).json() == {"jobs": []}

    # 3 of 4 GPUs free: a cluster of 2 x 2 GPUs waits, as one queue entry, holding nothing.
    hub.start_server("bob", {"profile": "tf-gpu-1"})
    j = submit(hub, pat, {"profile": "tf-gpu-2", "command": ["sleep", "300"], "workers": 2})
    wait_for(lambda: job(hub, pat, j["id"])["queue_position"] == 1, hub=hub, what="the cluster queued")
    assert [(w.server_name, w.count, w.workers) for w in hub.ledger().queue()] == [(f"job/{j['id']}", 2, 2)]
    assert [l.user for l in hub.ledger().leases()] == ["bob"]
    assert not job_containers(hub, docker_client, j["id"])

    # The fourth frees: it starts whole, each worker on its own two GPUs.
    hub.stop_server("bob")
    running = wait_for(lambda: (r := job(hub, pat, j["id"]))["started_at"] and r, timeout=60, hub=hub,
                       what="the cluster's containers to start")
    leases = hub.ledger().leases()
    assert sorted(l.server_name for l in leases) == [f"job/{j['id']}/worker-0", f"job/{j['id']}/worker-1"]
    containers = wait_for(lambda: len(c := job_containers(hub, docker_client, j["id"])) == 2 and c, hub=hub,
                          what="both workers' containers")
    for unit in running["units"]:
        [container] = [c for c in containers if c.name.endswith(f"-w{unit['worker']}")]
        wait_for(lambda c=container: c.reload() or c.status == "running", hub=hub, what="the worker running")
        assert visible_devices(container) == ",".join(unit["gpus"])

    # One worker is killed: the cluster ends as failed, naming it, and every GPU is free.
    [victim] = [c for c in containers if c.name.endswith("-w1")]
    victim.kill()
    done = wait_state(hub, pat, j["id"], ("succeeded", "failed", "cancelled"), timeout=30)
    assert done["state"] == "failed" and "worker 1" in done["message"], done
    assert not hub.ledger().leases()
    assert {l.end_reason for l in worker_leases(hub, j["id"])} == {"job-failed"}
    wait_for(lambda: not job_containers(hub, docker_client, j["id"]), hub=hub, what="no worker left")
    wait_for(lambda: not cluster_networks(hub, docker_client, j["id"]), hub=hub, what="its network removed")

    # Cancel stops every worker.
    k = submit(hub, pat, {"profile": "tf-gpu-2", "command": ["sleep", "300"], "workers": 2})
    wait_for(lambda: len(job_containers(hub, docker_client, k["id"])) == 2 and job(hub, pat, k["id"])["started_at"],
             hub=hub, what="the second cluster running")
    r = jobs_api(hub, "DELETE", f"/{k['id']}", pat)
    assert r.status_code == 200 and r.json()["state"] == "cancelled", r.text
    assert not hub.ledger().leases() and not job_containers(hub, docker_client, k["id"])
    assert {l.end_reason for l in worker_leases(hub, k["id"])} == {"job-cancelled"}


def test_after_a_sigkill_a_cluster_with_a_worker_missing_is_ended(make_hub, docker_client):
    hub, tokens = job_hub(make_hub, env={"GPUHUB_SIMULATED_GPUS": "2"})
    pat = tokens["pat"]
    j = submit(hub, pat, {"profile": "tf-gpu-1", "command": ["sleep", "300"], "workers": 2})
    wait_for(lambda: len(job_containers(hub, docker_client, j["id"])) == 2 and job(hub, pat, j["id"])["started_at"],
             hub=hub, what="the cluster running")
    hub.kill()
    # While nothing watches, one worker's container goes.
    docker_client.containers.get(f"{hub.prefix}-job-{j['id']}-w1").remove(force=True)
    time.sleep(1)
    assert len(hub.ledger().leases()) == 2  # still lent: nobody has looked yet
    hub.start()
    from .test_poolpage import wait_for_page

    wait_for_page(hub, pat)
    done = wait_state(hub, pat, j["id"], ("succeeded", "failed", "cancelled"), timeout=60)
    assert done["state"] == "failed" and "worker 1" in done["message"], done
    assert not hub.ledger().leases()
    wait_for(lambda: not job_containers(hub, docker_client, j["id"]), hub=hub, what="the half cluster removed")


def test_the_pool_page_form_submits_a_cluster_and_the_page_shows_its_workers(make_hub, docker_client):
    from .test_poolpage import page_api

    hub, tokens = job_hub(make_hub, env={"GPUHUB_SIMULATED_GPUS": "2"})
    pat = tokens["pat"]
    page = page_api(hub, "GET", "", pat)
    assert page.status_code == 200 and 'jobs/new"' in page.text and 'name="workers"' in page.text
    # Refused in words, nothing recorded.
    bad = page_api(hub, "POST", "jobs/new", pat, data={"profile": "tf-gpu-1", "command": "sleep 60",
                                                         "workers": "two"}, allow_redirects=False)
    assert bad.status_code == 400 and "whole number" in bad.text and "Traceback" not in bad.text
    assert jobs_api(hub, "GET", "", pat).json() == {"jobs": []}
    r = page_api(hub, "POST", "jobs/new", pat, data={"profile": "tf-gpu-1", "command": "sh -c 'sleep 60'",
                                                       "workers": "2", "timeout": "120"}, allow_redirects=False)
    assert r.status_code == 302, r.text
    job_id = int(r.headers["Location"].rstrip("/").rsplit("/", 1)[1])
    j = wait_for(lambda: (x := job(hub, pat, job_id))["started_at"] and x, hub=hub, what="the cluster running")
    assert j["workers"] == 2 and j["command"] == ["sh", "-c", "sleep 60"] and j["timeout"] == 120
    # The pool page lists it as one job with its workers; its own page names each worker's GPUs.
    listed = wait_for(lambda: "cluster of 2" in (t := page_api(hub, "GET", "", pat).text) and t, hub=hub,
                      what="the page's job list")
    assert "worker 0:" in listed and "worker 1:" in listed
    own = page_api(hub, "GET", f"jobs/{job_id}", pat).text
    for unit in j["units"]:
        assert f"worker {unit['worker']}" in own and unit["gpus"][0] in own
    assert jobs_api(hub, "DELETE", f"/{job_id}", pat).json()["state"] == "cancelled"
    assert not hub.ledger().leases() and not job_containers(hub, docker_client, job_id)
