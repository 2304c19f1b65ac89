"""Cluster jobs through the gpu-pool service, on a real hub, ledger and Docker (one host).

A cluster is one job of several containers (workers) that get all their GPUs at once or
wait holding none, find each other through TF_CONFIG on a network of their own, and end
together: the chief's exit 0 is success, any worker's failure ends them all.
"""

from __future__ import annotations

import json
import os
import re
import threading

import requests

from ..fixtures.hub import Hub, wait_for
from .test_gpu_spawner import visible_devices
from .test_jobs import job, job_containers, job_hub, jobs_api, submit, wait_state


def worker_leases(hub: Hub, job_id: int) -> list:
    return sorted((l for l in hub.ledger().history() if l.server_name.startswith(f"job/{job_id}/worker-")),
                  key=lambda l: l.server_name)


def cluster_networks(hub: Hub, docker_client, job_id: int) -> list:
    return docker_client.networks.list(names=[f"{hub.prefix}-job-{job_id}-net"])


def follow_log(hub: Hub, token: str, job_id: int, into: list) -> threading.Thread:
    """A follower of the job's whole log (?follow=1) on a thread: what it read lands in `into`."""
    def read():
        with requests.get(f"{hub.url}/services/gpu-pool/api/jobs/{job_id}/logs?follow=1", stream=True,
                          headers={"Authorization": f"token {token}"}, timeout=(10, 900)) as r:
            into.append(r.status_code)
            into.append(b"".join(r.iter_content(None)).decode(errors="replace"))
    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def test_a_two_worker_cluster_trains_one_epoch_and_the_chiefs_model_lands_in_the_home(
        make_hub, docker_client, mkl_image):
    hub, tokens = job_hub(make_hub, env={"GPUHUB_GPU_IMAGE": mkl_image})
    pat = tokens["pat"]
    # Each worker says what it was given, then trains its share (gRPC finds the peer by its name).
    command = ["sh", "-c", 'echo "gpus=$NVIDIA_VISIBLE_DEVICES tf_config=$TF_CONFIG"; exec python train.py '
               "--strategy multiworker --epochs 1 --model_path model-2w.keras"]
    j = submit(hub, pat, {"profile": "tf-gpu-1", "workdir": "tensorflow-examples", "command": command,
                          "workers": 2})
    assert j["workers"] == 2
    followed: list = []
    follower = follow_log(hub, pat, j["id"], followed)
    running = wait_state(hub, pat, j["id"], ("running", "succeeded", "failed"), timeout=120)
    assert [u["worker"] for u in running["units"]] == [0, 1]
    names = [f"{hub.prefix}-job-{j['id']}-w{i}" for i in (0, 1)]
    assert running["state"] == "running", running
    # Both workers' containers, while they train (an epoch takes far longer than this look).
    containers = wait_for(lambda: (cs := {c.name: c for c in job_containers(hub, docker_client, j["id"])})
                          and set(names) <= set(cs) and cs, hub=hub, what="both workers' containers")
    for name in names:
        container = containers[name]
        container.reload()
        host = container.attrs["HostConfig"]
        assert host["NetworkMode"] == f"{hub.prefix}-job-{j['id']}-net"  # only the cluster's network
        assert host["CapDrop"] == ["ALL"] and "no-new-privileges" in host["SecurityOpt"]
        assert container.attrs["Config"]["User"] == "1000:100"
    [net] = cluster_networks(hub, docker_client, j["id"])
    assert net.attrs["Internal"]
    done = wait_state(hub, pat, j["id"], ("succeeded", "failed"), timeout=900)
    logs = jobs_api(hub, "GET", f"/{j['id']}/logs", pat).text
    assert done["state"] == "succeeded", (done, logs[-3000:])
    # Each worker saw exactly its own leased GPU and a TF_CONFIG naming both, by stable names.
    leases = worker_leases(hub, j["id"])
    assert [l.server_name for l in leases] == [f"job/{j['id']}/worker-0", f"job/{j['id']}/worker-1"]
    assert {l.end_reason for l in leases} == {"job-finished"}
    for i, lease in enumerate(leases):
        seen = re.search(rf"^\[worker {i}\] gpus=(\S*) tf_config=(.*)$", logs, re.M)
        assert seen, logs[-3000:]
        assert seen.group(1) == ",".join(lease.gpu_uuids) == ",".join(done["units"][i]["gpus"])
        config = json.loads(seen.group(2))
        assert config == {"cluster": {"worker": [f"{n}:2222" for n in names]}, "task": {"type": "worker", "index": i}}
    assert len({u for l in leases for u in l.gpu_uuids}) == 2
    assert "[worker 0] test accuracy" in logs and "model saved to" in logs
    assert "[worker 1] test accuracy" in logs and "leaves the model to the chief" in logs
    one = jobs_api(hub, "GET", f"/{j['id']}/logs?worker=1", pat)
    assert one.status_code == 200 and "[worker" not in one.text and "leaves the model" in one.text
    assert jobs_api(hub, "GET", f"/{j['id']}/logs?worker=2", pat).status_code == 400
    # The follower saw both workers' lines as they came, each whole and marked, and ended with the cluster.
    follower.join(timeout=60)
    assert not follower.is_alive() and followed[0] == 200, followed
    lines = followed[1].splitlines()
    assert lines and all(re.match(r"\[worker [01]\] ", line) for line in lines), followed[1][-2000:]
    assert any(l.startswith("[worker 0] test accuracy") and "model saved to" in l for l in lines)
    assert any(l.startswith("[worker 1] test accuracy") and "leaves the model" in l for l in lines)
    wait_for(lambda: not job_containers(hub, docker_client, j["id"]), hub=hub, what="its containers removed")
    wait_for(lambda: not cluster_networks(hub, docker_client, j["id"]), hub=hub, what="its network removed")
    # The chief's model is in the user's home, where their notebook sees it.
    hub.start_server("pat", {"profile": "tf-cpu"})
    from .test_gpu_spawner import container_of

    code, out = container_of(hub, docker_client, "pat").exec_run(
        ["ls", "-l", "/home/jovyan/tensorflow-examples/model-2w.keras"])
    assert code == 0, out


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
    assert (not hub.ledger().leases() and not hub.ledger().queue()
            and jobs_api(hub, "GET", "", pat).json() == {"jobs": []})

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
    from .test_poolpage_scripts import service_pid

    service = service_pid(hub)
    hub.kill()
    # The jobs service ends with its hub; only then does nothing watch.
    wait_for(lambda: not os.path.exists(f"/proc/{service}"), hub=hub, what="the jobs service to end with its hub")
    # While nothing watches, one worker's container goes.
    docker_client.containers.get(f"{hub.prefix}-job-{j['id']}-w1").remove(force=True)
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


def test_a_profile_that_allows_jobs_a_network_gives_the_cluster_a_route_out_not_the_hubs_network(
        make_hub, docker_client):
    # tf-gpu-1 allows jobs a network: the cluster's own network goes out; no worker joins the
    # hub's shared one (any user's server there would reach the workers' gRPC port).
    hub, tokens = job_hub(make_hub, extra_config="""
c.GPUDockerSpawner.profiles = [dict(p, job_network=True) if p["slug"] == "tf-gpu-1" else p
                               for p in c.GPUDockerSpawner.profiles]
""")
    pat = tokens["pat"]
    j = submit(hub, pat, {"profile": "tf-gpu-1", "command": ["sleep", "300"], "workers": 2})
    wait_for(lambda: len(job_containers(hub, docker_client, j["id"])) == 2 and job(hub, pat, j["id"])["started_at"],
             hub=hub, what="the cluster running")
    own = f"{hub.prefix}-job-{j['id']}-net"
    for container in job_containers(hub, docker_client, j["id"]):
        container.reload()
        networks = container.attrs["NetworkSettings"]["Networks"]
        assert set(networks) == {own}, networks
        # Its peers find it by its stable name there.
        assert container.name in networks[own]["Aliases"]
    (network,) = cluster_networks(hub, docker_client, j["id"])
    assert network.attrs["Internal"] is False
    assert network.attrs["Options"]["com.docker.network.bridge.name"].startswith("gpuhub-o")
    assert jobs_api(hub, "DELETE", f"/{j['id']}", pat).json()["state"] == "cancelled"
    wait_for(lambda: not job_containers(hub, docker_client, j["id"]), hub=hub, what="its containers removed")


def test_a_job_reads_ended_only_once_its_containers_are_gone(make_hub, docker_client):
    # The lease contract: a job (and its leases) reads as ended only once its units are removed,
    # so a client that sees the end sees no container of it left (they were removed after the
    # end was recorded, and a service that stopped meanwhile left them behind).
    hub, tokens = job_hub(make_hub)
    pat = tokens["pat"]
    left = {}
    for attempt in range(3):
        for workers in (1, 2):
            j = submit(hub, pat, {"profile": "tf-gpu-1", "command": ["true"], "workers": workers})
            done = wait_for(lambda j=j: (now := job(hub, pat, j["id"]))["state"]
                            not in ("queued", "starting", "running") and now,
                            timeout=120, interval=0.05, what=f"job {j['id']} to end", hub=hub)
            assert done["state"] == "succeeded", done
            name = f"{hub.prefix}-job-{j['id']}"
            found = [c.name for c in job_containers(hub, docker_client, j["id"])
                     if c.name == name or c.name.startswith(name + "-")]
            if found:
                left[(attempt, workers)] = found
    assert not left, f"containers still there when their job read as ended: {left}"
