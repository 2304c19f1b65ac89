"""Borrowed GPUs end to end (issue 38), on the real hub, pool service, ledger and Docker: a job
borrows idle GPUs beyond its user's share; a server within its share asks for them; the job is
told (SIGTERM: its own trap prints a line), stopped within the grace, its lease ends
`reclaimed`, the server gets the GPUs, and the job queues again and runs once GPUs free.  The
borrowing limits refuse with a 403 naming them.

Four simulated GPUs; alice's share is 1 (the per-user limit), bob's 2 (group `ml`); a short
`reclaim_grace` comes through configuration.  Every wait is on observable state."""

from __future__ import annotations

from ..fixtures.hub import wait_for
from .test_jobs import job, job_containers, job_hub, jobs_api, lease_of, submit, wait_state

GRACE = 15
BORROWING = f"""
c.GPUPool.max_gpus_per_user = 1
c.GPUPool.group_gpu_limits = {{"ml": 2}}
c.GPUPool.reclaim_grace = {GRACE}
c.GPUPool.max_borrowed_gpus_per_user = 3
c.GPUDockerSpawner.profiles = list(c.GPUDockerSpawner.profiles) + [{{
    "slug": "tf-gpu-3", "display_name": "TensorFlow + 3 GPUs", "gpus": 3,
    "image": c.GPUDockerSpawner.profiles[0]["image"]}}]
"""
# A training that heeds the notice: its trap of TERM says so and exits (as a checkpointing one would).
TRAINING = ["sh", "-c", 'trap "echo notice heeded: checkpoint saved; exit 0" TERM; echo training; '
                        "while true; do sleep 1; done"]


def logs(hub, token: str, job_id: int) -> str:
    r = jobs_api(hub, "GET", f"/{job_id}/logs", token)
    assert r.status_code == 200, r.text
    return r.text


def test_a_borrowed_job_gives_its_gpus_to_a_server_within_its_share_with_notice_and_runs_again(
        make_hub, docker_client):
    hub, tokens = job_hub(make_hub, env={"GPUHUB_SIMULATED_GPUS": "4", "GPUHUB_LEASE_WAIT_TIMEOUT": "300"},
                          users=("alice", "bob"), extra_config=BORROWING)
    assert hub.api("POST", "/groups/ml", json={"users": ["bob"]}).status_code == 201
    alice = tokens["alice"]

    # Beyond her share without asking to borrow: the quota refuses, as before.
    r = jobs_api(hub, "POST", "", alice, json={"profile": "tf-gpu-3", "command": TRAINING})
    assert r.status_code == 403 and "at most 1 GPU" in r.json()["message"], r.text
    r = jobs_api(hub, "POST", "", alice, json={"profile": "tf-gpu-3", "command": TRAINING, "borrow": "yes"})
    assert r.status_code == 400 and "'borrow' must be true or false" in r.json()["message"], r.text

    # Asking to borrow: 3 of the 4 idle GPUs, a borrowed lease, and the job's status says so.
    j = submit(hub, alice, {"profile": "tf-gpu-3", "command": TRAINING, "borrow": True})
    running = wait_for(lambda: (r := job(hub, alice, j["id"]))["started_at"] and r, timeout=120, hub=hub,
                       what="alice's borrowing job to start")
    assert running["state"] == "running" and len(running["gpus"]) == 3 and running["attempts"] == 1
    assert running["borrowed"] and running["borrowed_notice"] == \
        f"running on borrowed GPUs: may be reclaimed with {GRACE} seconds' notice"
    first = lease_of(hub, running["lease_id"])
    assert first.borrowed and first.reclaim_at is None
    wait_for(lambda: "training" in logs(hub, alice, j["id"]), 60, "the job's first output", hub)
    # The borrowing limits: a second borrower of 3 would hold 6 > 3 borrowed GPUs.
    r = jobs_api(hub, "POST", "", alice, json={"profile": "tf-gpu-3", "command": ["true"], "borrow": True})
    assert r.status_code == 403 and "GPUPool.max_borrowed_gpus_per_user" in r.json()["message"], r.text

    # bob, within his share of 2, asks for 2: one is free, the borrowed lease is asked back.
    r = hub.api("POST", "/users/bob/server", json={"profile": "tf-gpu-2"}, timeout=60)
    assert r.status_code in (201, 202), r.text
    asked = wait_for(lambda: lease_of(hub, first.id).reclaim_at, 60, "the borrowed lease asked back", hub)

    # Within the grace (and a spawn's time) bob's server is ready on GPUs alice's job gave back.
    ready = hub.wait_ready("bob", timeout=GRACE + 90)
    ended = lease_of(hub, first.id)
    assert ended.end_reason == "reclaimed" and ended.ended_at >= asked
    bob_gpus = ready["state"]["gpu_uuids"]
    assert len(bob_gpus) == 2 and set(bob_gpus) & set(first.gpu_uuids)
    # Told first: the job's own trap of TERM ran (its line is in the kept log) before the stop.
    again = wait_for(lambda: (r := job(hub, alice, j["id"]))["state"] == "queued" and r, 30,
                     "the reclaimed job back in the queue", hub)
    assert "notice heeded: checkpoint saved" in logs(hub, alice, j["id"])
    assert again["attempts"] == 2 and again["lease_id"] is None and again["gpus"] == []
    assert "reclaimed" in again["message"] and "attempt 2" in again["message"]
    assert not again["borrowed"] and again["submitted_at"] == j["submitted_at"]
    assert not job_containers(hub, docker_client, j["id"])

    # It waits while bob holds the GPUs (1 free of the 3 it needs), and runs once he stops.
    hub.stop_server("bob")
    rerun = wait_for(lambda: (r := job(hub, alice, j["id"]))["started_at"] and r["state"] == "running" and r,
                     timeout=120, hub=hub, what="the requeued job to run again")
    assert rerun["attempts"] == 2 and rerun["lease_id"] != first.id and rerun["borrowed"]
    assert lease_of(hub, rerun["lease_id"]).borrowed
    r = jobs_api(hub, "DELETE", f"/{j['id']}", alice)
    assert r.status_code == 200 and r.json()["state"] == "cancelled", r.text


def test_a_job_submitted_without_requeue_ends_when_reclaimed(make_hub, docker_client):
    hub, tokens = job_hub(make_hub, env={"GPUHUB_SIMULATED_GPUS": "2"}, users=("alice", "bob"),
                          extra_config="c.GPUPool.max_gpus_per_user = 0\nc.GPUPool.group_gpu_limits = "
                                       f"{{'ml': 2}}\nc.GPUPool.reclaim_grace = {GRACE}\n")
    assert hub.api("POST", "/groups/ml", json={"users": ["bob"]}).status_code == 201
    alice = tokens["alice"]
    j = submit(hub, alice, {"profile": "tf-gpu-2", "command": TRAINING, "borrow": True, "requeue": False})
    running = wait_for(lambda: (r := job(hub, alice, j["id"]))["started_at"] and r, timeout=120, hub=hub,
                       what="the borrowing job to start")
    assert running["borrowed"] and running["requeue"] is False
    hub.start_server("bob", {"profile": "tf-gpu-1"}, timeout=GRACE + 90)
    done = wait_for(lambda: (r := job(hub, alice, j["id"]))["state"] == "cancelled" and r, 30,
                    "the job to end", hub)
    assert "not queued again" in done["message"] and done["attempts"] == 1
    assert lease_of(hub, running["lease_id"]).end_reason == "reclaimed"
    assert "notice heeded" in logs(hub, alice, j["id"])


# alice's share is none (she borrows); bob's, 1 GPU (group `ml`), for a server on the small image.
RESUMING = """
c.GPUPool.max_gpus_per_user = 0
c.GPUPool.group_gpu_limits = {"ml": 1}
c.GPUPool.reclaim_grace = 60
c.GPUDockerSpawner.profiles = list(c.GPUDockerSpawner.profiles) + [{
    "slug": "lab-gpu-1", "display_name": "JupyterLab + 1 GPU", "gpus": 1,
    "image": c.GPUDockerSpawner.profiles[0]["image"]}]
"""


def test_a_reclaimed_training_resumes_at_the_epoch_it_was_at_and_saves_its_model(
        make_hub, docker_client, mkl_image):
    hub, tokens = job_hub(make_hub, env={"GPUHUB_SIMULATED_GPUS": "1", "GPUHUB_GPU_IMAGE": mkl_image,
                                         "GPUHUB_LEASE_WAIT_TIMEOUT": "300"},
                          users=("alice", "bob"), extra_config=RESUMING)
    assert hub.api("POST", "/groups/ml", json={"users": ["bob"]}).status_code == 201
    alice = tokens["alice"]
    # The image's own train.py, unchanged: 3 epochs of the bundled digits, one image a step (an
    # epoch of some seconds, so the notice lands in the second).
    j = submit(hub, alice, {"profile": "tf-gpu-1", "workdir": "tensorflow-examples", "borrow": True,
                            "command": ["python", "train.py", "--epochs", "3", "--batch_size", "1",
                                        "--model_path", "model.keras"]})
    wait_for(lambda: "epoch 1/3" in logs(hub, alice, j["id"]), 300, "the first epoch to end", hub)
    first = job(hub, alice, j["id"])
    assert first["state"] == "running" and first["borrowed"], first

    # bob, within his share, asks for the GPU: the training is told, stops, and queues again.
    r = hub.api("POST", "/users/bob/server", json={"profile": "lab-gpu-1"}, timeout=60)
    assert r.status_code in (201, 202), r.text
    again = wait_for(lambda: (r := job(hub, alice, j["id"]))["state"] == "queued" and r, 120,
                     "the reclaimed training back in the queue", hub)
    assert again["attempts"] == 2 and lease_of(hub, first["lease_id"]).end_reason == "reclaimed"
    before = logs(hub, alice, j["id"])
    assert "epoch 1/3" in before and "epoch 3/3" not in before, before[-2000:]
    stopped = [line for line in before.splitlines() if "SIGTERM: stopping after" in line]
    assert stopped == ["train.py: SIGTERM: stopping after 1 of 3 epochs; the next run resumes at epoch 2 from "
                       f"/home/jovyan/.gpuhub/checkpoints/job-{j['id']}/train-model"], before[-2000:]
    hub.wait_ready("bob", timeout=120)

    # bob stops: the second attempt runs, starts at epoch 2 and saves the model.
    hub.stop_server("bob")
    done = wait_state(hub, alice, j["id"], ("succeeded", "failed", "cancelled"), timeout=600)
    after = logs(hub, alice, j["id"])
    assert done["state"] == "succeeded" and done["attempts"] == 2, (done, after[-2000:])
    assert "resuming from the backup in /home/jovyan/.gpuhub/checkpoints/job-" in after
    assert "1 of 3 epochs done, starting at epoch 2" in after
    epochs = [line.split(":", 1)[0] for line in after.splitlines() if line.startswith("epoch ")]
    assert epochs == ["epoch 2/3", "epoch 3/3"], after[-2000:]
    assert "model saved to model.keras" in after  # in its directory, tensorflow-examples

    # The model is in alice's home; the finished training left no backup behind.
    hub.start_server("alice", {"profile": "tf-cpu"})
    from .test_gpu_spawner import container_of

    code, out = container_of(hub, docker_client, "alice").exec_run(
        ["sh", "-c", f"ls -l /home/jovyan/tensorflow-examples/model.keras && "
                     f"ls -A /home/jovyan/.gpuhub/checkpoints/job-{j['id']}"])
    assert code == 0 and b"model.keras" in out and b"train-model" not in out, out
