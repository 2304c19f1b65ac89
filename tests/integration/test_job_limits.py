"""Per-user job limits on a real hub, ledger and Docker (c.JobLimits).

A user's jobs run a few at a time (overall, per profile, within a CPU quota),
more wait queued, and a submission past the queue's cap is refused with 429,
saying the limit and what the user has; nothing of a refused job is left.
"""

from __future__ import annotations

from ..fixtures.hub import wait_for
from .test_jobs import job, job_containers, job_hub, jobs_api, submit, wait_state
from .test_poolpage import logged_in

LIMITS = """
c.JobLimits.max_running = 2
c.JobLimits.max_queued = 2
c.JobLimits.max_cpus = 100
"""


def test_a_users_jobs_run_a_few_at_a_time_and_the_queue_past_its_cap_answers_429(make_hub, docker_client):
    hub, tokens = job_hub(make_hub, users=("pat", "bob"), extra_config=LIMITS)
    pat = tokens["pat"]
    body = {"profile": "tf-cpu", "command": ["sleep", "300"]}
    first, second = submit(hub, pat, body), submit(hub, pat, body)
    third, fourth = submit(hub, pat, body), submit(hub, pat, body)
    for j in (first, second):
        wait_state(hub, pat, j["id"], "running", timeout=90)
    # The third and fourth wait, and say why.
    for j in (third, fourth):
        waiting = wait_for(lambda j=j: (r := job(hub, pat, j["id"]))["message"] and r, hub=hub,
                           what=f"job {j['id']} to say why it waits")
        assert waiting["state"] == "queued" and "2 jobs running" in waiting["message"], waiting
        assert not job_containers(hub, docker_client, j["id"])
    r = jobs_api(hub, "POST", "", pat, json=body)
    assert r.status_code == 429, r.text
    message = r.json()["message"]
    assert "2 jobs queued" in message and "at most 2" in message and "cancel" in message, message
    assert "Traceback" not in r.text
    # The job's page says why it waits.
    page = logged_in(hub, "pat").get(f"{hub.url}/services/gpu-pool/jobs/{third['id']}", timeout=30)
    assert page.status_code == 200 and 'id="job-waiting"' in page.text and "2 jobs running" in page.text
    assert len(jobs_api(hub, "GET", "", pat).json()["jobs"]) == 4
    # Limits are per user: bob is not held back by pat's jobs.
    bobs = submit(hub, tokens["bob"], body)
    wait_state(hub, tokens["bob"], bobs["id"], "running", timeout=90)
    # One of pat's running jobs ends: the earliest queued one takes its place.
    assert jobs_api(hub, "DELETE", f"/{first['id']}", pat).status_code == 200
    started = wait_state(hub, pat, third["id"], "running", timeout=90)
    assert started["message"] is None, started
    assert job(hub, pat, fourth["id"])["state"] == "queued"
    assert submit(hub, pat, body)["state"] == "queued"  # room in the queue again


def test_cpu_jobs_count_toward_a_cpu_quota_and_a_profile_has_its_own_caps(make_hub, docker_client):
    # tf-cpu jobs take 2 CPUs each: a 3-CPU quota runs one at a time.
    hub, tokens = job_hub(make_hub, extra_config="""
c.JobLimits.max_cpus = 3
c.JobLimits.profile_limits = {"tf-gpu-1": {"running": 1, "queued": 1}}
c.GPUDockerSpawner.profiles = [dict(p, cpu_limit=0.5) if p["slug"] == "tf-gpu-1" else p
                               for p in c.GPUDockerSpawner.profiles] + [
    dict(c.GPUDockerSpawner.profiles[0], slug="big-cpu", display_name="Big", cpu_limit=8)]
""")
    pat = tokens["pat"]
    body = {"profile": "tf-cpu", "command": ["sleep", "300"]}
    first, second = submit(hub, pat, body), submit(hub, pat, body)
    wait_state(hub, pat, first["id"], "running", timeout=90)
    waiting = wait_for(lambda: (r := job(hub, pat, second["id"]))["message"] and r, hub=hub,
                       what="the second CPU job to say why it waits")
    assert waiting["state"] == "queued" and "2 of your 3 CPUs" in waiting["message"], waiting
    assert not job_containers(hub, docker_client, second["id"])
    # A GPU job of half a CPU still fits beside it; its profile runs one at a time and
    # queues one.
    gpu_body = {"profile": "tf-gpu-1", "command": ["sleep", "300"]}
    gpu = submit(hub, pat, gpu_body)
    wait_state(hub, pat, gpu["id"], "running", timeout=90)
    behind = submit(hub, pat, gpu_body)
    waiting = wait_for(lambda: (r := job(hub, pat, behind["id"]))["message"] and r, hub=hub,
                       what="the second GPU job to say why it waits")
    assert "tf-gpu-1" in waiting["message"] and waiting["queue_position"] is None, waiting
    r = jobs_api(hub, "POST", "", pat, json=gpu_body)
    assert r.status_code == 429, r.text
    assert "1 tf-gpu-1 job queued" in r.json()["message"] and "at most 1" in r.json()["message"], r.text
    # A profile that alone asks more CPUs than the quota could never run: refused at once.
    r = jobs_api(hub, "POST", "", pat, json={"profile": "big-cpu", "command": ["true"]})
    assert r.status_code == 403 and "8 CPUs" in r.json()["message"] and "3" in r.json()["message"], r.text
    assert len(jobs_api(hub, "GET", "", pat).json()["jobs"]) == 4
    # The running CPU job ends: the waiting one gets its CPUs.
    jobs_api(hub, "DELETE", f"/{first['id']}", pat)
    wait_state(hub, pat, second["id"], "running", timeout=90)
