"""GPU batch jobs through the gpu-pool service, on a real hub, ledger and Docker.

The hub starts the service; jobs share the notebook servers' pool, queue and
quotas; their containers get exactly the leased GPUs (through the daemon's
NVIDIA hook double) and their leases end with job-* reasons.
"""

from __future__ import annotations

import contextlib
import os

import requests

from spawner.engines import make_job_engine

from ..fixtures.hub import Hub, wait_for
from .test_gpu_spawner import visible_devices
from .test_poolpage import logged_in, page_api, wait_for_page

ACTIVE = ("queued", "running")


def jobs_api(hub: Hub, method: str, path: str, token: str, **kwargs) -> requests.Response:
    return page_api(hub, method, "api/jobs" + path, token, **kwargs)


def submit(hub: Hub, token: str, body: dict) -> dict:
    r = jobs_api(hub, "POST", "", token, json=body)
    assert r.status_code == 201, r.text
    return r.json()


def job(hub: Hub, token: str, job_id: int) -> dict:
    r = jobs_api(hub, "GET", f"/{job_id}", token)
    assert r.status_code == 200, r.text
    return r.json()


def wait_state(hub: Hub, token: str, job_id: int, states, timeout: float = 120) -> dict:
    states = (states,) if isinstance(states, str) else states
    return wait_for(lambda: (j := job(hub, token, job_id))["state"] in states and j,
                    timeout=timeout, what=f"job {job_id} to be {states}", hub=hub)


def job_containers(hub: Hub, docker_client, job_id: int | None = None) -> list:
    name = f"{hub.prefix}-job-" + (str(job_id) if job_id is not None else "")
    # Filtered by the daemon, and blind to containers removed while listed: other
    # tests' containers come and go on the shared dockerd.
    return [c for c in docker_client.containers.list(all=True, filters={"name": name}, ignore_removed=True)
            if c.name.startswith(name)]


def lease_of(hub: Hub, lease_id: int):
    return hub.ledger().lease(lease_id)


def job_hub(make_hub, env: dict | None = None, users=("pat",), extra_config: str = "") -> tuple[Hub, dict]:
    hub = make_hub(extra_config, env=env)
    tokens = {}
    for user in users:
        hub.create_user(user, admin=user == "ada")
        tokens[user] = hub.user_token(user)
    wait_for_page(hub, tokens[users[0]])
    return hub, tokens


def test_a_job_trains_on_the_mkl_image_and_its_model_lands_in_the_home(make_hub, docker_client, mkl_image):
    hub, tokens = job_hub(make_hub, env={"GPUHUB_GPU_IMAGE": mkl_image})
    pat = tokens["pat"]
    j = submit(hub, pat, {"profile": "tf-gpu-1", "workdir": "tensorflow-examples",
                          "command": ["python", "train.py", "--epochs", "1", "--model_path", "model.keras"]})
    assert j["state"] in ACTIVE and j["profile"] == "tf-gpu-1"
    running = wait_state(hub, pat, j["id"], ("running", "succeeded", "failed"), timeout=120)
    done = wait_state(hub, pat, j["id"], ("succeeded", "failed"), timeout=600)
    logs = jobs_api(hub, "GET", f"/{j['id']}/logs", pat).text
    assert done["state"] == "succeeded", (done, logs[-2000:])
    assert done["exit_code"] == 0 and len(done["gpus"]) == 1 and done["host"]
    assert "model saved to" in logs
    lease = lease_of(hub, done["lease_id"])
    assert lease.end_reason == "job-finished" and list(lease.gpu_uuids) == done["gpus"]
    assert running["gpus"] == done["gpus"]
    wait_for(lambda: not job_containers(hub, docker_client, j["id"]), hub=hub, what="its container removed")
    # The model is in the user's home, where their notebook sees it.
    hub.start_server("pat", {"profile": "tf-cpu"})
    from .test_gpu_spawner import container_of

    code, out = container_of(hub, docker_client, "pat").exec_run(
        ["ls", "-l", "/home/jovyan/tensorflow-examples/model.keras"])
    assert code == 0, out


def test_a_queued_job_starts_when_a_server_stops_and_cancels_free_everything(make_hub, docker_client):
    hub, tokens = job_hub(make_hub, env={"GPUHUB_SIMULATED_GPUS": "2"}, users=("pat", "bob", "cat"))
    pat = tokens["pat"]
    hub.start_server("bob", {"profile": "tf-gpu-1"})
    hub.start_server("cat", {"profile": "tf-gpu-1"})
    first = submit(hub, pat, {"profile": "tf-gpu-1", "command": ["sleep", "300"]})
    second = submit(hub, pat, {"profile": "tf-gpu-1", "command": ["sleep", "300"]})
    wait_for(lambda: job(hub, pat, second["id"])["queue_position"] == 2, what="two jobs queued", hub=hub)
    assert job(hub, pat, first["id"])["queue_position"] == 1
    assert [(w.user, w.server_name) for w in hub.ledger().queue()] == [
        ("pat", f"job/{first['id']}"), ("pat", f"job/{second['id']}")]

    # Cancelled while queued: it leaves the queue, took nothing.
    r = jobs_api(hub, "DELETE", f"/{second['id']}", pat)
    assert r.status_code == 200 and r.json()["state"] == "cancelled", r.text
    assert [w.server_name for w in hub.ledger().queue()] == [f"job/{first['id']}"]
    assert r.json()["lease_id"] is None and not job_containers(hub, docker_client, second["id"])
    assert jobs_api(hub, "DELETE", f"/{second['id']}", pat).status_code == 409

    # bob's server stops: the queued job gets his GPU and runs.
    freed = hub.server_model("bob")["state"]["gpu_uuids"]
    hub.stop_server("bob")
    running = wait_for(lambda: (r := job(hub, pat, first["id"]))["started_at"] and r, timeout=60, hub=hub,
                       what="the queued job's container to start")
    assert running["state"] == "running" and running["queue_position"] is None
    assert running["gpus"] == freed
    container = wait_for(lambda: job_containers(hub, docker_client, first["id"]), hub=hub,
                         what="the job's container")[0]
    container.reload()
    assert visible_devices(container) == freed[0]
    host = container.attrs["HostConfig"]
    assert host["CapDrop"] == ["ALL"] and not host.get("CapAdd") and not host["Privileged"]
    assert "no-new-privileges" in host["SecurityOpt"] and host["NetworkMode"] == "none"
    assert host["NanoCpus"] == 2 * 10**9 and host["Memory"] == 8 * 1024**3
    assert container.attrs["Config"]["User"] == "1000:100"
    assert any(m["Type"] == "volume" and m["Destination"] == "/home/jovyan" and m["Name"].startswith(hub.prefix)
               for m in container.attrs["Mounts"])
    # One quota for jobs and servers: the user's lease is in the ledger under their name.
    assert {l.user for l in hub.ledger().leases()} == {"pat", "cat"}
    # JupyterLab's GPU panel (api/lab) lists it among pat's jobs, its log link answers; never cat's.
    def lab_jobs(token):
        return page_api(hub, "GET", "api/lab", token).json()["jobs"]
    listed = wait_for(lambda: [j for j in lab_jobs(pat) if j["id"] == first["id"] and j["state"] == "running"],
                      hub=hub, what="the running job in pat's lab panel")
    assert [j["id"] for j in lab_jobs(pat)] == [first["id"]]  # the cancelled one is not listed
    logs = requests.get(f"{hub.url}{listed[0]['logs_url']}", headers={"Authorization": f"token {pat}"}, timeout=30)
    assert logs.status_code == 200, logs.text
    assert lab_jobs(tokens["cat"]) == []

    # Cancelled while running: stopped, GPU free at once, lease ended job-cancelled.
    r = jobs_api(hub, "DELETE", f"/{first['id']}", pat)
    assert r.status_code == 200 and r.json()["state"] == "cancelled", r.text
    assert lease_of(hub, running["lease_id"]).end_reason == "job-cancelled"
    assert {l.user for l in hub.ledger().leases()} == {"cat"}
    assert not job_containers(hub, docker_client, first["id"])
    listed = jobs_api(hub, "GET", "", pat).json()["jobs"]
    assert [(j["id"], j["state"]) for j in listed] == [(second["id"], "cancelled"), (first["id"], "cancelled")]


def test_a_job_over_its_timeout_is_stopped_and_its_log_kept(make_hub, docker_client):
    hub, tokens = job_hub(make_hub, users=("pat", "bob"))
    pat = tokens["pat"]
    j = submit(hub, pat, {"profile": "tf-gpu-1", "timeout": 3,
                          "command": ["sh", "-c", "echo started; sleep 120"]})
    done = wait_state(hub, pat, j["id"], ("timed-out", "succeeded", "failed"), timeout=90)
    assert done["state"] == "timed-out", done
    assert lease_of(hub, done["lease_id"]).end_reason == "job-timeout" and not hub.ledger().leases()
    wait_for(lambda: not job_containers(hub, docker_client), hub=hub, what="the job's container removed")
    assert "started" in jobs_api(hub, "GET", f"/{j['id']}/logs", pat).text  # kept after the end
    # `gpu-pool history` tells the job apart from notebook servers.
    import contextlib
    import io

    from spawner.cli import main as gpu_pool

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert gpu_pool(["--db-url", hub.pool_db_url, "history", "--user", "pat"]) == 0
    assert f"job/{j['id']}" in out.getvalue() and "job-timeout" in out.getvalue(), out.getvalue()
    # Only the owner sees it; a failing command is "failed" with its exit code.
    assert jobs_api(hub, "GET", f"/{j['id']}", tokens["bob"]).status_code == 404
    assert jobs_api(hub, "GET", "", tokens["bob"]).json() == {"jobs": []}
    f = submit(hub, pat, {"profile": "tf-cpu", "command": ["sh", "-c", "exit 3"]})
    failed = wait_state(hub, pat, f["id"], ("failed", "succeeded"), timeout=60)
    assert (failed["state"], failed["exit_code"], failed["gpus"]) == ("failed", 3, [])


HOSTILE = [
    ({"profile": "tf-gpu-1", "command": ["true"], "image": "alpine"}, "'image'"),
    ({"profile": "tf-gpu-1", "command": ["true"], "env": {"NVIDIA_VISIBLE_DEVICES": "all"}}, "'env'"),
    ({"profile": "tf-gpu-1", "command": ["true"], "mounts": ["/:/host"]}, "'mounts'"),
    ({"profile": "tf-gpu-1", "command": ["true"], "workdir": "/etc"}, "relative"),
    ({"profile": "tf-gpu-1", "command": ["true"], "workdir": "a/../../etc"}, "'..'"),
    ({"profile": "tf-gpu-1", "command": "python train.py"}, "list of strings"),
    ({"profile": "tf-gpu-1", "command": ["python", 5]}, "string"),
    ({"profile": "tf-gpu-1", "command": ["x" * 1000] * 20}, "bytes"),
    ({"profile": "tf-gpu-1", "command": ["true"], "timeout": 10**9}, "maximum"),
    ({"profile": "no-such", "command": ["true"]}, "Unknown profile"),
    ({"command": ["true"]}, "'profile' is required"),
    (["tf-gpu-1"], "JSON object"),
]


# A profile added by a config loaded after hub_config, as an admin's own file would.
LATE_PROFILE = """
c.GPUDockerSpawner.profiles = list(c.GPUDockerSpawner.profiles) + [{
    "slug": "late-gpu", "display_name": "Late", "gpus": 1, "job_max_seconds": 5,
    "image": c.GPUDockerSpawner.profiles[0]["image"]}]
"""


def test_hostile_bodies_get_400_and_leave_nothing(make_hub, docker_client):
    hub, tokens = job_hub(make_hub, extra_config=LATE_PROFILE)
    pat = tokens["pat"]
    # The service sees the hub's final config: the late profile, with its own maximum.
    r = jobs_api(hub, "POST", "", pat, json={"profile": "late-gpu", "command": ["true"], "timeout": 6})
    assert r.status_code == 400 and "between 1 and 5" in r.json()["message"], r.text
    for body, message in HOSTILE:
        r = jobs_api(hub, "POST", "", pat, json=body)
        assert r.status_code == 400, (body, r.text)
        assert message in r.json()["message"] and "Traceback" not in r.text, (body, r.text)
    r = jobs_api(hub, "POST", "", pat, data=b"{" + b" " * 70000 + b"}")
    assert r.status_code == 400 and "larger" in r.json()["message"]
    assert jobs_api(hub, "POST", "", pat, data=b"not json").status_code == 400
    assert jobs_api(hub, "GET", "", "not-a-token").status_code == 403
    assert jobs_api(hub, "GET", "", pat).json() == {"jobs": []}
    assert not hub.ledger().leases() and not hub.ledger().history() and not hub.ledger().queue()
    assert not job_containers(hub, docker_client)


def test_a_users_jobs_and_servers_share_one_quota(make_hub, docker_client):
    hub, tokens = job_hub(make_hub, env={"GPUHUB_MAX_GPUS_PER_USER": "1"})
    pat = tokens["pat"]
    hub.start_server("pat", {"profile": "tf-gpu-1"})
    r = jobs_api(hub, "POST", "", pat, json={"profile": "tf-gpu-1", "command": ["true"]})
    assert r.status_code == 403 and "limit" in r.json()["message"].lower(), r.text
    assert jobs_api(hub, "GET", "", pat).json() == {"jobs": []} and not job_containers(hub, docker_client)
    assert [l.server_name for l in hub.ledger().leases()] == [""]


def test_jobs_survive_a_hub_sigkill_and_their_leases_end_after(make_hub, docker_client):
    hub, tokens = job_hub(make_hub, env={"GPUHUB_SIMULATED_GPUS": "1"})
    pat = tokens["pat"]
    j = submit(hub, pat, {"profile": "tf-gpu-1", "command": ["sh", "-c", "sleep 15; echo finished"]})
    running = wait_for(lambda: (r := job(hub, pat, j["id"]))["started_at"] and r, hub=hub,
                       what="the job's container to start")
    queued = submit(hub, pat, {"profile": "tf-gpu-1", "command": ["echo", "second"]})
    wait_for(lambda: job(hub, pat, queued["id"])["queue_position"] == 1, hub=hub, what="the second job queued")
    from .test_poolpage_scripts import service_pid

    service = service_pid(hub)
    hub.kill()
    # The jobs service ends with its hub; the job runs on without either.
    wait_for(lambda: not os.path.exists(f"/proc/{service}"), hub=hub, what="the jobs service to end with its hub")
    assert [c.status for c in job_containers(hub, docker_client, j["id"])] == ["running"]
    assert lease_of(hub, running["lease_id"]).active
    hub.start()
    wait_for_page(hub, pat)
    done = wait_state(hub, pat, j["id"], ("succeeded", "failed"), timeout=90)
    assert done["state"] == "succeeded", done
    assert "finished" in jobs_api(hub, "GET", f"/{j['id']}/logs", pat).text
    assert lease_of(hub, running["lease_id"]).end_reason == "job-finished"
    # The queued one queued again, got the GPU once the first was done, and ran.
    second = wait_state(hub, pat, queued["id"], ("succeeded", "failed"), timeout=90)
    assert second["state"] == "succeeded" and second["gpus"] == done["gpus"], second
    assert lease_of(hub, second["lease_id"]).end_reason == "job-finished" and not hub.ledger().leases()
    wait_for(lambda: not job_containers(hub, docker_client), hub=hub, what="the job containers removed")
    log = hub.log_path.read_text(errors="replace")
    assert "is gone; stopping the gpu-pool service" in log  # the orphaned service stepped aside
    assert f"Job {j['id']} of pat found running; taking it up again" in log
    assert f"Job {queued['id']} of pat found queued; taking it up again" in log


def test_the_pool_page_lists_jobs_and_an_admin_cancels_one(make_hub, docker_client):
    hub, tokens = job_hub(make_hub, env={"GPUHUB_ADMIN_USERS": "ada"}, users=("pat", "ada"))
    pat = tokens["pat"]
    j = submit(hub, pat, {"profile": "tf-gpu-1", "command": ["sh", "-c", "echo hello-from-job; sleep 300"]})
    wait_state(hub, pat, j["id"], "running", timeout=60)
    wait_for(lambda: "hello-from-job" in jobs_api(hub, "GET", f"/{j['id']}/logs", pat).text, hub=hub,
             what="the running job's log")
    page = wait_for(lambda: (p := logged_in(hub, "pat").get(f"{hub.url}/services/gpu-pool/", timeout=30))
                    and 'id="jobs"' in p.text and p, hub=hub, what="the jobs on the page")
    assert f'jobs/{j["id"]}"' in page.text and "running" in page.text
    everyone = jobs_api(hub, "GET", "?all=1", tokens["ada"]).json()["jobs"]
    assert [(x["id"], x["user"]) for x in everyone] == [(j["id"], "pat")]
    assert jobs_api(hub, "GET", "?all=1", pat).json()["jobs"][0]["user"] == "pat"  # only theirs anyway
    ada = logged_in(hub, "ada")
    admin_page = ada.get(f"{hub.url}/services/gpu-pool/", timeout=30).text
    assert "pat" in admin_page and f'jobs/{j["id"]}"' in admin_page
    job_page = ada.get(f"{hub.url}/services/gpu-pool/jobs/{j['id']}", timeout=30)
    assert "hello-from-job" in job_page.text and 'id="cancel"' in job_page.text
    xsrf = job_page.text.split('name="_xsrf" value="')[1].split('"')[0]
    r = ada.post(f"{hub.url}/services/gpu-pool/jobs/{j['id']}", data={"_xsrf": xsrf}, timeout=90)
    assert r.status_code == 200 and "cancelled" in r.text, r.text[:500]
    assert job(hub, pat, j["id"])["state"] == "cancelled"
    assert not hub.ledger().leases()


def test_job_leases_are_judged_by_the_job_reconciler_not_the_hubs(tmp_path, docker_client, base_image):
    """The hub's reconciler keeps job leases (no hub server holds them); the jobs' own
    reconciler ends a job lease without a live job once its container is removed, and
    removes a job container that holds GPUs without a lease."""
    import asyncio
    import secrets

    from spawner.engines.common.labels import LABEL_GPUS, LABEL_HOST, LABEL_JOB, LABEL_LEASE, LABEL_POOL, pool_identity
    from spawner.engines.common.reconcile_containers import reconcile
    from spawner.inventory import SimulatedInventory
    from spawner.jobs.reconcile import reconcile_jobs
    from spawner.jobs.runner import JobRunner
    from spawner.jobs.runner_settings import JobSettings
    from spawner.pool import GPUPool
    from spawner.pool.ledger.job_records import RUNNING
    from spawner.profiles import DEFAULT_PROFILES

    host, tag = "jobs-reconcile-host", secrets.token_hex(3)
    pool = GPUPool(db_url=f"sqlite:///{tmp_path / 'ledger.sqlite'}", inventory=SimulatedInventory(count=4, host=host))
    runner = JobRunner(pool, js := JobSettings(profiles=DEFAULT_PROFILES, host=host, prefix=f"gpuhub-jr{tag}"),
                       make_job_engine(js))
    made = []

    def container(name, job_id, lease_id, gpus):
        made.append(docker_client.containers.run(
            base_image, ["sleep", "300"], name=f"gpuhub-jr{tag}-{name}", detach=True, network_mode="none",
            labels={LABEL_JOB: str(job_id), LABEL_LEASE: str(lease_id), LABEL_GPUS: ",".join(gpus),
                    LABEL_HOST: host, LABEL_POOL: pool_identity(pool)}))
        return made[-1]

    try:
        orphan = pool.try_acquire("ann", "job/999", 1)  # a lease whose job record never came
        orphan_box = container("orphan", 999, orphan.id, orphan.gpu_uuids)
        live_job = runner.ledger.create("bob", [], "tf-gpu-1", ["sleep", "300"], "", 600, host, 1000, 100)
        live = pool.try_acquire("bob", f"job/{live_job.id}", 1)
        runner.ledger.update(live_job.id, state=RUNNING, lease_id=live.id, gpu_uuids=live.gpu_uuids)
        live_box = container("live", live_job.id, live.id, live.gpu_uuids)
        unleased_box = container("unleased", 998, 424242, ("GPU-nobody-lent-this",))

        report = reconcile(pool, docker_client, host, [], min_age=0)
        assert orphan.id not in report.ended and live.id not in report.ended
        assert {l.id for l in pool.leases()} == {orphan.id, live.id}
        for box in (orphan_box, live_box):
            box.reload()
            assert box.status == "running"

        done = asyncio.run(reconcile_jobs(runner, min_age=0))
        assert done["ended"] == [orphan.id]
        assert pool.lease(orphan.id).end_reason == "reconciled"
        assert [l.id for l in pool.leases()] == [live.id]
        left = {c.name for c in docker_client.containers.list(all=True, filters={"name": f"gpuhub-jr{tag}"},
                                                              ignore_removed=True)}
        assert left == {live_box.name}, (left, unleased_box.name)
    finally:
        for box in made:
            with contextlib.suppress(Exception):
                box.remove(force=True)
        pool.close()


def test_gpu_job_submits_follows_and_cancels_from_inside_a_notebook_server(make_hub, docker_client):
    import re

    from .test_gpu_spawner import container_of

    hub, tokens = job_hub(make_hub)
    hub.start_server("pat", {"profile": "tf-cpu"})
    box = container_of(hub, docker_client, "pat")

    def sh(command: str) -> tuple[int, str]:
        code, out = box.exec_run(["sh", "-c", command], workdir="/home/jovyan")
        return code, out.decode(errors="replace")

    # The server's own token and the bridge address the hub gave it.
    code, out = sh("mkdir -p work && cd work && "
                   "gpu-job submit --profile tf-gpu-1 -- sh -c 'echo from-the-job; pwd; sleep 2'")
    assert code == 0, out
    job_id = int(re.search(r"job (\d+): (queued|running)", out).group(1))
    code, out = sh(f"gpu-job logs -f {job_id}")  # returns when the job ends
    assert code == 0 and "from-the-job" in out and "/home/jovyan/work" in out, out
    done = wait_state(hub, tokens["pat"], job_id, ("succeeded", "failed"), timeout=60)
    assert done["state"] == "succeeded" and done["workdir"] == "work" and len(done["gpus"]) == 1
    code, out = sh(f"gpu-job status {job_id}")
    assert code == 0 and f"job {job_id}: succeeded, exit code 0" in out, out
    code, out = sh("gpu-job list")
    assert code == 0 and re.search(rf"{job_id}\s+succeeded", out), out

    code, out = sh("gpu-job submit --profile tf-gpu-1 -- sleep 300")
    long_id = int(re.search(r"job (\d+):", out).group(1))
    wait_state(hub, tokens["pat"], long_id, "running", timeout=60)
    code, out = sh(f"gpu-job cancel {long_id}")
    assert code == 0 and f"job {long_id}: cancelled" in out, out
    assert not hub.ledger().leases()

    code, out = sh("gpu-job submit --profile no-such -- true")
    assert code == 1 and "Unknown profile" in out and "Traceback" not in out, out


def test_a_job_runs_as_the_users_directory_uid_and_gid(make_hub, openldap, docker_client):
    from .test_auth_hub import directory_hub, form_login

    hub = directory_hub(make_hub, openldap)
    alice = openldap.users["alice"]
    assert form_login(hub, alice.name, alice.password).status_code == 302  # auth_state: uid/gid
    token = hub.user_token(alice.name)
    wait_for_page(hub, token)
    j = submit(hub, token, {"profile": "tf-gpu-1",
                            "command": ["sh", "-c", "id -u; id -g; stat -c %u:%g $HOME; touch $HOME/out"]})
    done = wait_state(hub, token, j["id"], ("succeeded", "failed"), timeout=120)
    output = jobs_api(hub, "GET", f"/{j['id']}/logs", token).text
    assert done["state"] == "succeeded", (done, output)
    assert output.split()[:3] == [str(alice.uid_number), str(alice.gid_number),
                                  f"{alice.uid_number}:{alice.gid_number}"], output


def test_a_job_queued_behind_an_idle_server_starts_when_the_culler_stops_it(make_hub, docker_client):
    hub = make_hub(env={"GPUHUB_SIMULATED_GPUS": "1", "GPUHUB_CULL": "true", "GPUHUB_CULL_EVERY": "1",
                        "GPUHUB_CULL_TIMEOUT_GPU": "10", "GPUHUB_CULL_TIMEOUT_CPU": "600"})
    for user in ("pat", "bob"):
        hub.create_user(user)
    pat = hub.user_token("pat")
    wait_for_page(hub, pat)
    hub.start_server("bob", {"profile": "tf-gpu-1"})
    j = submit(hub, pat, {"profile": "tf-gpu-1", "command": ["echo", "after-the-cull"]})
    assert job(hub, pat, j["id"])["state"] == "queued"
    done = wait_state(hub, pat, j["id"], ("succeeded", "failed"), timeout=120)
    assert done["state"] == "succeeded", done
    assert [l.end_reason for l in hub.ledger().history(user="bob")] == ["culled"]
    assert lease_of(hub, done["lease_id"]).end_reason == "job-finished"
    assert "after-the-cull" in jobs_api(hub, "GET", f"/{j['id']}/logs", pat).text


def test_a_job_whose_container_will_not_stop_keeps_its_gpu_until_it_is_gone(make_hub, docker_client,
                                                                          docker_faults):
    # Jobs are reconciled as often as the hub's servers are (c.Reconciler).
    hub, tokens = job_hub(make_hub, env={"DOCKER_HOST": docker_faults.url},
                          extra_config="c.Reconciler.interval = 2\nc.Reconciler.min_lease_age = 0\n")
    pat = tokens["pat"]
    j = submit(hub, pat, {"profile": "tf-gpu-1", "command": ["sleep", "300"]})
    running = wait_for(lambda: (r := job(hub, pat, j["id"]))["started_at"] and r, hub=hub,
                       what="the job's container to start")
    # `docker stop` fails (a GPU process stuck in the kernel), and so does removal.
    docker_faults.fail("POST", r"/containers/[^/]+/(stop|kill)$", 500, "container did not stop in time")
    docker_faults.fail("DELETE", r"/containers/[^/]+$", 500, "container did not stop in time")
    r = jobs_api(hub, "DELETE", f"/{j['id']}", pat)
    assert r.status_code == 200 and r.json()["state"] == "cancelled", r.text
    [box] = job_containers(hub, docker_client, j["id"])
    assert box.status == "running"
    lease = lease_of(hub, running["lease_id"])
    assert lease.active and "would not stop" in (lease.problem or ""), lease
    assert running["gpus"][0] not in {s.gpu.uuid for s in hub.ledger().gpus() if s.lease is None}

    # Docker recovers: the job reconciler removes the container, then ends the lease.
    docker_faults.clear()
    wait_for(lambda: not lease_of(hub, running["lease_id"]).active, timeout=30, hub=hub, what="the lease to end")
    assert lease_of(hub, running["lease_id"]).end_reason == "job-cancelled"
    assert not job_containers(hub, docker_client, j["id"])


def test_a_user_named_like_a_jobs_container_cannot_end_that_job(make_hub, docker_client):
    """With DockerSpawner.escape = "legacy" a user `job-<id>` would have a server named
    `<prefix>-job-<id>`, which is job <id>'s container: DockerSpawner removes a leftover
    container of its server's name when it starts one.  The start is refused, naming why, and
    pat's job runs on untouched."""
    hub, tokens = job_hub(make_hub, extra_config='c.DockerSpawner.escape = "legacy"\n')
    pat = tokens["pat"]
    j = submit(hub, pat, {"profile": "tf-cpu", "command": ["sh", "-c", "sleep 600"]})
    wait_state(hub, pat, j["id"], "running")
    [container] = wait_for(lambda: job_containers(hub, docker_client, j["id"]), what="the job's container", hub=hub)
    assert container.name == f"{hub.prefix}-job-{j['id']}"
    hub.create_user(f"job-{j['id']}")
    code, message = hub.refused_spawn(f"job-{j['id']}", {"profile": "tf-cpu"})
    # (The old spawner removed it: "Job 1 of pat failed: its container was removed from outside".)
    assert [c.status for c in job_containers(hub, docker_client, j["id"])] == ["running"]
    assert job(hub, pat, j["id"])["state"] == "running"
    assert f"Your server's container would be named {container.name}, the name of a batch job's" in message, \
        (code, message[-2000:])
    assert code in (0, 409), code
    assert jobs_api(hub, "DELETE", f"/{j['id']}", pat).status_code == 200
