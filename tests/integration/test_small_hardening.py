"""Small hardening found in one review (issue 22, item 10), on the real hub, ledger and dockerd:
the job reconciler's order and the networks it removes, a job's argv kept out of the log,
api/exec's unknown fields, and the home hand-over's helper container when the hub stops during
a spawn."""

from __future__ import annotations

import contextlib
import signal
import threading

from devservices.waiting import until
from spawner.engines import make_job_engine

from ..fixtures.hub import wait_for
from .test_jobs import job_hub, submit, wait_state
from .test_poolpage import ADMIN_ENV, page_api


def test_the_job_reconciler_leaves_alone_a_job_that_starts_while_it_looks(tmp_path, docker_client, base_image):
    """A job whose lease and container both come while a pass runs (after it read the
    leases, before it lists containers, in the old order) keeps its container."""
    import asyncio
    import secrets

    import docker.errors

    from spawner.engines.common.labels import LABEL_GPUS, LABEL_HOST, LABEL_JOB, LABEL_LEASE, LABEL_POOL, pool_identity
    from spawner.inventory import SimulatedInventory
    from spawner.jobs.reconcile import reconcile_jobs
    from spawner.jobs.runner import JobRunner
    from spawner.jobs.runner_settings import JobSettings
    from spawner.pool import GPUPool
    from spawner.pool.ledger.job_records import RUNNING
    from spawner.profiles import DEFAULT_PROFILES

    host, tag = "jobs-order-host", secrets.token_hex(3)
    pool = GPUPool(db_url=f"sqlite:///{tmp_path / 'ledger.sqlite'}", inventory=SimulatedInventory(count=2, host=host))
    runner = JobRunner(pool, js := JobSettings(profiles=DEFAULT_PROFILES, host=host, prefix=f"gpuhub-jo{tag}"),
                       make_job_engine(js))
    made = []
    read_leases = pool.leases

    def a_job_starts_meanwhile():
        job = runner.ledger.create("bob", [], "tf-gpu-1", ["sleep", "300"], "", 600, host, 1000, 100)
        lease = pool.try_acquire("bob", f"job/{job.id}", 1)
        runner.ledger.update(job.id, state=RUNNING, lease_id=lease.id, gpu_uuids=lease.gpu_uuids)
        made.append(docker_client.containers.run(
            base_image, ["sleep", "300"], name=f"gpuhub-jo{tag}-job-{job.id}", detach=True, network_mode="none",
            labels={LABEL_JOB: str(job.id), LABEL_LEASE: str(lease.id), LABEL_GPUS: ",".join(lease.gpu_uuids),
                    LABEL_HOST: host, LABEL_POOL: pool_identity(pool)}))

    def leases_then_a_job_starts(*args, **kwargs):
        got = read_leases(*args, **kwargs)
        if not made:
            a_job_starts_meanwhile()
        return got

    pool.leases = leases_then_a_job_starts
    try:
        done = asyncio.run(reconcile_jobs(runner, min_age=0))
        if not made:  # the pass listed its containers first: the job starts after both reads
            a_job_starts_meanwhile()
        [box] = made
        try:
            box.reload()
        except docker.errors.NotFound:
            raise AssertionError(f"the pass removed the job's container: {done}") from None
        assert box.status == "running" and done["removed"] == [], done
        # The next pass sees both, and keeps them too.
        done = asyncio.run(reconcile_jobs(runner, min_age=0))
        box.reload()
        assert box.status == "running" and done == {"ended": [], "removed": [], "networks": []}
    finally:
        for box in made:
            with contextlib.suppress(Exception):
                box.remove(force=True)
        pool.close()


def test_the_job_reconciler_removes_the_networks_of_ended_jobs_and_keeps_a_running_ones(tmp_path, docker_client):
    """A cluster's network left behind (the gpu-pool service stopped after its job ended, before
    the runner removed it) goes at the next pass; a running job's, and another ledger's, stay."""
    import asyncio
    import secrets

    import docker.errors

    from spawner.engines.common.labels import LABEL_JOB, LABEL_POOL, pool_identity
    from spawner.inventory import SimulatedInventory
    from spawner.jobs.cluster import network_name
    from spawner.jobs.reconcile import reconcile_jobs
    from spawner.jobs.runner import JobRunner
    from spawner.jobs.runner_settings import JobSettings
    from spawner.pool import GPUPool
    from spawner.pool.ledger.job_records import CANCELLED, RUNNING
    from spawner.profiles import DEFAULT_PROFILES

    host, tag = "jobs-net-host", secrets.token_hex(3)
    pool = GPUPool(db_url=f"sqlite:///{tmp_path / 'ledger.sqlite'}", inventory=SimulatedInventory(count=2, host=host))
    js = JobSettings(profiles=DEFAULT_PROFILES, host=host, prefix=f"gpuhub-jn{tag}")
    runner = JobRunner(pool, js, make_job_engine(js))
    ended = runner.ledger.create("bob", [], "tf-cpu", ["true"], "", 600, host, 1000, 100)
    running = runner.ledger.create("amy", [], "tf-cpu", ["sleep", "60"], "", 600, host, 1000, 100)
    runner.ledger.update(ended.id, state=CANCELLED)
    runner.ledger.update(running.id, state=RUNNING)
    ours = pool_identity(pool)
    made = {
        "ended": docker_client.networks.create(network_name(js, ended.id), driver="bridge", internal=True,
                                               labels={LABEL_JOB: str(ended.id), LABEL_POOL: ours}),
        "unknown": docker_client.networks.create(network_name(js, 999), driver="bridge", internal=True,
                                                 labels={LABEL_JOB: "999", LABEL_POOL: ours}),
        "running": docker_client.networks.create(network_name(js, running.id), driver="bridge", internal=True,
                                                 labels={LABEL_JOB: str(running.id), LABEL_POOL: ours}),
        "other ledger": docker_client.networks.create(f"gpuhub-jn{tag}-other", driver="bridge", internal=True,
                                                      labels={LABEL_JOB: str(ended.id), LABEL_POOL: "another"}),
    }

    def present():
        there = set()
        for what, network in made.items():
            try:
                network.reload()
                there.add(what)
            except docker.errors.NotFound:
                pass
        return there

    try:
        assert present() == set(made)
        done = asyncio.run(reconcile_jobs(runner, min_age=0))
        assert present() == {"running", "other ledger"}, done
        assert sorted(done["networks"]) == sorted([network_name(js, ended.id), network_name(js, 999)])
        # The running job ends: its network goes at the next pass.
        runner.ledger.update(running.id, state=CANCELLED)
        asyncio.run(reconcile_jobs(runner, min_age=0))
        assert present() == {"other ledger"}
    finally:
        for network in made.values():
            with contextlib.suppress(Exception):
                network.remove()
        pool.close()


def test_a_jobs_argv_stays_out_of_the_log_and_api_exec_refuses_fields_it_does_not_know(make_hub):
    hub, tokens = job_hub(make_hub, env=ADMIN_ENV, users=("pat", "ada"))
    pat, ada = tokens["pat"], tokens["ada"]
    secret = "SECRET-typed-3141"
    j = submit(hub, pat, {"profile": "tf-cpu", "command": ["sh", "-c", "true", f"--password={secret}"]})
    wait_state(hub, pat, j["id"], ("succeeded", "failed"), timeout=90)
    log = hub.log_path.read_text(errors="replace")
    assert f"Job {j['id']} of pat queued" in log and f"Job {j['id']} of pat succeeded" in log
    assert secret not in log

    # {"user": "root"} would be dropped without a word, and the script run as pat.
    hub.start_server("pat", {"profile": "tf-cpu"})
    r = page_api(hub, "POST", "api/exec", ada, json={"script": "id", "users": ["pat"], "user": "root"})
    assert r.status_code == 400, r.text
    assert "'user'" in r.json()["message"] and "script" in r.json()["message"] and "Traceback" not in r.text
    r = page_api(hub, "POST", "api/exec", ada, json={"script": "id", "users": ["pat"]})
    assert r.status_code == 200 and r.json()["results"][0]["exit_code"] == 0, r.text


def test_a_home_helper_is_not_left_behind_when_the_hub_stops_during_a_spawn(make_hub, docker_client,
                                                                            docker_faults):
    # Servers kept through the hub's restart (production's upgrade setting): its shutdown
    # waits on no Docker call, and cancels the spawn while Docker creates the helper.
    hub = make_hub(env={"DOCKER_HOST": docker_faults.url, "GPUHUB_CLEANUP_SERVERS": "false"})
    hub.create_user("pat")
    home = f"{hub.prefix}-home-pat"
    # A home without an owner's marker: the spawn reads it through a helper container.
    docker_client.volumes.create(home)

    def stop_the_hub_then_answer():
        # Docker has made the helper; the hub hears of it only once its shutdown is under way.
        hub.process.send_signal(signal.SIGTERM)
        # Docker's own client gives up after 60 s; the hub's shutdown may also end first.
        with contextlib.suppress(AssertionError):
            until(lambda: hub.process.poll() is not None
                  or "Cancelling pending tasks" in hub.log_path.read_text(errors="replace"), timeout=30)

    docker_faults.after("POST", r"/containers/create$", stop_the_hub_then_answer, times=1)

    def spawn():
        with contextlib.suppress(Exception):
            hub.api("POST", "/users/pat/server", json={"profile": "tf-cpu"})

    threading.Thread(target=spawn, daemon=True).start()
    wait_for(lambda: hub.process.poll() is not None, timeout=120, what="the hub to stop", hub=hub)
    log = hub.log_path.read_text(errors="replace")
    assert "Cancelling pending tasks" in log and "Read timed out" not in log
    left = docker_client.containers.list(all=True, filters={"volume": home}, ignore_removed=True)
    for c in left:
        c.remove(force=True)
    assert [(c.status, c.labels) for c in left] == []
