"""Batch jobs on the harness's real Swarm: a job is a service on the node whose GPUs it leased.

One Swarm per machine: this module is in the "swarm" work unit (tests/conftest.py), which
one test worker runs whole, after the others of that unit; run it by hand under
`flock /tmp/gpuhub-exclusive.lock`.
"""

from __future__ import annotations

import re

import pytest

from tests.fixtures.hub import wait_for
from tests.fixtures.swarm import docker

from .test_jobs import jobs_api, submit, wait_state
from .test_poolpage import wait_for_page
from .test_swarm import in_task, lease_of, profiles_config

pytestmark = pytest.mark.integration


def job_service(hub, job_id: int) -> str:
    return f"{hub.prefix}-job-{job_id}"


def test_gpu_job_from_a_notebook_on_one_worker_runs_on_the_other_and_frees_its_gpu(
        make_swarm_hub, swarm_cluster, notebook_image):
    hub = make_swarm_hub(profiles_config(notebook_image), env={"GPUHUB_POOL_PAGE": "true"})
    hub.create_user("pat")
    token = hub.user_token("pat")
    wait_for_page(hub, token)
    a100 = next(n for n in swarm_cluster.nodes if n.labels["gpu.model"] == "a100")
    t4 = next(n for n in swarm_cluster.nodes if n.labels["gpu.model"] == "t4")
    hub.start_server("pat", {"profile": "a100"})
    assert lease_of(hub, "pat")["gpu_host"] == a100.hostname

    def sh(command: str) -> str:
        return in_task(swarm_cluster, hub, "pat", f"cd /home/jovyan && {command} 2>&1; echo \"rc=$?\"")

    # gpu-job from the notebook (a task on the a100 worker) reaches the hub over the overlay.
    out = sh("mkdir -p work && cd work && gpu-job submit --profile t4 -- sh -c 'echo from-the-job; pwd; sleep 2'")
    assert "rc=0" in out, out
    job_id = int(re.search(r"job (\d+): (queued|running)", out).group(1))
    out = sh(f"gpu-job logs -f {job_id}")  # returns when the job ends: the service's logs, followed
    assert "from-the-job" in out and "/home/jovyan/work" in out and "rc=0" in out, out
    done = wait_state(hub, token, job_id, ("succeeded", "failed"), timeout=90)
    assert done["state"] == "succeeded" and done["exit_code"] == 0, done
    # It ran on the t4 node, and its runtime saw exactly the leased GPU.
    [gpu] = done["gpus"]
    assert gpu in t4.gpus
    assert gpu in t4.visible_devices().values()
    # Its GPU is lendable again, its service gone; the server's lease is untouched.
    assert [lease.server_name for lease in hub.ledger().leases()] == [""]
    wait_for(lambda: not docker("service", "ls", "-q", "--filter", f"name={job_service(hub, job_id)}"),
             what="the job's service removed")

    # A failing command: its exit code from the task, its output kept.
    failing = submit(hub, token, {"profile": "tf-gpu-1", "command": ["sh", "-c", "echo about-to-fail; exit 3"]})
    failed = wait_state(hub, token, failing["id"], ("succeeded", "failed"), timeout=90)
    assert failed["state"] == "failed" and failed["exit_code"] == 3, failed
    assert "about-to-fail" in jobs_api(hub, "GET", f"/{failing['id']}/logs", token).text

    # Cancel a running one: the GPU comes back only once Swarm confirms the task ended.
    long = submit(hub, token, {"profile": "t4", "command": ["sleep", "300"]})
    running = wait_state(hub, token, long["id"], "running", timeout=90)
    assert running["gpus"][0] in t4.gpus
    r = jobs_api(hub, "DELETE", f"/{long['id']}", token)
    assert r.status_code == 200 and r.json()["state"] == "cancelled", r.text
    assert [lease.server_name for lease in hub.ledger().leases()] == [""]
    assert not docker("service", "ls", "-q", "--filter", f"name={job_service(hub, long['id'])}")
    hub.stop_server("pat")
    assert hub.ledger().leases() == []


def test_a_job_is_locked_down_on_its_node_and_a_cpu_job_sees_no_gpu(make_swarm_hub, swarm_cluster, notebook_image):
    hub = make_swarm_hub(profiles_config(notebook_image), env={"GPUHUB_POOL_PAGE": "true"})
    hub.create_user("kim")
    token = hub.user_token("kim")
    wait_for_page(hub, token)
    script = ("grep -E '^(NoNewPrivs|CapEff|Uid)' /proc/self/status; echo visible=$NVIDIA_VISIBLE_DEVICES; "
              "echo routes-out=$(awk '$2 == \"00000000\"' /proc/net/route | wc -l)")
    job = submit(hub, token, {"profile": "tf-cpu", "command": ["sh", "-c", script]})
    done = wait_state(hub, token, job["id"], ("succeeded", "failed"), timeout=90)
    assert done["state"] == "succeeded", done
    log = jobs_api(hub, "GET", f"/{job['id']}/logs", token).text
    fields = dict(re.findall(r"(NoNewPrivs|CapEff|Uid):\s*(\S+)", log))
    assert fields.get("CapEff") == "0000000000000000" and fields.get("Uid") not in (None, "0"), log
    assert fields.get("NoNewPrivs") == "1", log  # the harness's nodes enforce it in daemon.json
    assert "visible=void" in log
    # No network for this profile: an internal overlay of its own, with no route out.
    assert "routes-out=0" in log, log
    assert hub.ledger().leases() == []


# Issue 38 on Swarm: alice (share 1) borrows both GPUs of the t4 node for a job; bob (share 2)
# asks for a server there.  A long notice, so that a job that heeds its SIGTERM is told apart
# from one killed when the notice is over.
SWARM_GRACE = 40
SWARM_BORROWING = """
c.GPUPool.max_gpus_per_user = 1
c.GPUPool.group_gpu_limits = {{"ml": 2}}
c.GPUPool.reclaim_grace = {grace}
c.GPUPool.max_borrowed_gpus_per_user = 2
c.GPUDockerSpawner.profiles = list(c.GPUDockerSpawner.profiles) + [{{
    "slug": "t4-2", "display_name": "2 T4", "gpus": 2, "image": {image!r},
    "node_labels": {{"gpu.model": "t4"}}}}]
"""
# A training that heeds the notice: its trap of TERM says so and exits (as a checkpointing one would).
HEEDING = ["sh", "-c", 'trap "echo notice heeded: checkpoint saved; exit 0" TERM; echo training; '
                       "while true; do sleep 1; done"]


def test_a_borrowed_job_on_a_swarm_node_gets_sigterm_and_gives_its_gpus_to_a_server_within_its_share(
        make_swarm_hub, swarm_cluster, notebook_image):
    from .test_jobs import job

    hub = make_swarm_hub(profiles_config(notebook_image) + SWARM_BORROWING.format(grace=SWARM_GRACE,
                                                                                   image=notebook_image),
                         env={"GPUHUB_POOL_PAGE": "true", "GPUHUB_LEASE_WAIT_TIMEOUT": "300"})
    for user in ("alice", "bob"):
        hub.create_user(user)
    assert hub.api("POST", "/groups/ml", json={"users": ["bob"]}).status_code == 201
    alice = hub.user_token("alice")
    wait_for_page(hub, alice)
    t4 = next(n for n in swarm_cluster.nodes if n.labels["gpu.model"] == "t4")

    j = submit(hub, alice, {"profile": "t4-2", "command": HEEDING, "borrow": True})
    running = wait_for(lambda: (r := job(hub, alice, j["id"]))["started_at"] and r, timeout=120, hub=hub,
                       what="alice's borrowing job to run on the t4 node")
    assert running["borrowed"] and set(running["gpus"]) == set(t4.gpus), running
    lease = hub.ledger().lease(running["lease_id"])
    assert lease.borrowed and lease.host == t4.hostname
    # Its service lets its processes end for the whole notice after SIGTERM before Swarm kills them.
    spec = docker("service", "inspect", "--format", "{{json .Spec.TaskTemplate.ContainerSpec.StopGracePeriod}}",
                  job_service(hub, j["id"]))
    assert int(spec) == SWARM_GRACE * 10**9, spec
    wait_for(lambda: "training" in jobs_api(hub, "GET", f"/{j['id']}/logs", alice).text, 60,
             "the job's first output", hub)

    # bob, within his share, asks for a server on the t4 node: the borrowed lease is asked back.
    r = hub.api("POST", "/users/bob/server", json={"profile": "t4-2"}, timeout=60)
    assert r.status_code in (201, 202), r.text
    asked = wait_for(lambda: hub.ledger().lease(lease.id).reclaim_at, 60, "the borrowed lease asked back", hub)
    ready = hub.wait_ready("bob", timeout=SWARM_GRACE + 120)
    ended = hub.ledger().lease(lease.id)
    assert ended.end_reason == "reclaimed" and ended.ended_at >= asked
    # Heeded: the job's own trap of SIGTERM ended it well before the notice was over (a job that
    # got no SIGTERM runs on until Swarm kills it, SWARM_GRACE s after the mark).
    heeded_in = (ended.ended_at - asked).total_seconds()
    print(f"\nthe reclaimed job ended {heeded_in:.1f} s after the mark (notice {SWARM_GRACE} s)")
    assert heeded_in < SWARM_GRACE - 10, heeded_in
    assert set(ready["state"]["gpu_uuids"]) == set(t4.gpus) and ready["state"]["gpu_host"] == t4.hostname
    again = wait_for(lambda: (r := job(hub, alice, j["id"]))["state"] == "queued" and r, 30,
                     "the reclaimed job back in the queue", hub)
    assert again["attempts"] == 2 and "reclaimed" in again["message"], again
    assert not docker("service", "ls", "-q", "--filter", f"name={job_service(hub, j['id'])}")
    log = jobs_api(hub, "GET", f"/{j['id']}/logs", alice).text
    print(f"kept log: {log[-300:]!r}")
    r = jobs_api(hub, "DELETE", f"/{j['id']}", alice)
    assert r.status_code == 200 and r.json()["state"] == "cancelled", r.text
    hub.stop_server("bob")
