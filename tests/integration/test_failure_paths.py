"""The ledger and Docker agree on every failure path (the real hub, dockerd and ledger).

Faults a healthy daemon or database cannot be made to show on demand (a
`docker stop` that fails, an inspect that answers 500, a database that stops
answering) are injected in front of the real ones (tests/fixtures/faults.py).
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import pytest
import requests

from spawner.engines.common.labels import LABEL_LEASE

from ..fixtures.hub import Hub, wait_for
from .test_gpu_spawner import container_of

RECONCILE_FAST = """
c.Reconciler.interval = 1
c.Reconciler.min_lease_age = 0
c.Spawner.poll_interval = 1
"""


def lease_of(hub: Hub, lease_id: int):
    return hub.ledger().lease(lease_id)


def test_a_stop_that_fails_keeps_the_gpu_lent_until_the_container_is_gone(make_hub, docker_client,
                                                                         docker_faults):
    hub = make_hub(RECONCILE_FAST, env={"DOCKER_HOST": docker_faults.url})
    hub.create_user("stuck")
    state = hub.start_server("stuck", {"profile": "tf-gpu-1"})["state"]
    lease_id = state["gpu_lease_id"]
    container = container_of(hub, docker_client, "stuck")
    # `docker stop` times out (a GPU process stuck in the kernel) and so does removal.
    docker_faults.fail("POST", r"/containers/[^/]+/(stop|kill)$", 500, "container did not stop in time")
    docker_faults.fail("DELETE", r"/containers/[^/]+$", 500, "container did not stop in time")

    r = hub.api("DELETE", "/users/stuck/server")
    assert r.status_code in (202, 204), r.text
    hub.wait_stopped("stuck")  # the hub forgets the server...
    hub.wait_reconcile_passes(2)  # ...and reconcile passes fail to remove the container
    container.reload()
    assert container.status == "running"
    lease = lease_of(hub, lease_id)
    assert lease.active, "the GPU was freed while its container runs"
    assert "would not stop" in (lease.problem or "")
    # An admin sees why: gpu-pool status names the stuck container.
    import contextlib
    import io

    from spawner.cli import main as gpu_pool

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert gpu_pool(["--db-url", hub.pool_db_url, "status"]) == 0
    assert "would not stop" in out.getvalue() and container.name in out.getvalue()
    # The next user cannot get that GPU.
    others = {s.gpu.uuid for s in hub.ledger().gpus() if s.lease is None}
    assert state["gpu_uuids"][0] not in others

    # Docker recovers: the reconciler removes the container, then ends the lease.
    docker_faults.clear()
    wait_for(lambda: not lease_of(hub, lease_id).active, timeout=30, what="the lease to end", hub=hub)
    assert lease_of(hub, lease_id).end_reason == "reconciled"
    assert container.name not in {c.name for c in docker_client.containers.list(all=True, ignore_removed=True)}


def test_an_inspect_that_answers_500_is_not_a_dead_server(make_hub, docker_client, docker_faults):
    hub = make_hub("c.Spawner.poll_interval = 1\n", env={"DOCKER_HOST": docker_faults.url})
    hub.create_user("flaky")
    state = hub.start_server("flaky", {"profile": "tf-gpu-1"})["state"]
    docker_faults.fail("GET", r"/containers/[^/]+/json$", 500, "daemon is unwell")
    inspected = docker_faults.count("GET", r"/containers/[^/]+/json$")
    # Several polls (poll_interval 1 s), every one answered 500.
    wait_for(lambda: docker_faults.count("GET", r"/containers/[^/]+/json$") >= inspected + 3, timeout=60,
             what="three inspects answered 500", hub=hub)
    docker_faults.clear()
    server = hub.server_model("flaky")
    assert server and server["ready"], "a 500 from Docker was taken for a dead server"
    assert [lease.id for lease in hub.ledger().leases()] == [state["gpu_lease_id"]]
    assert container_of(hub, docker_client, "flaky").status == "running"
    hub.stop_server("flaky")
    assert hub.ledger().leases() == []


def test_a_kept_container_survives_reconcile_after_a_restart_on_the_same_gpu(make_hub, docker_client):
    # One GPU: the restart gets the same GPU under a new lease.  The kept
    # container must be remade with the new lease, or the reconciler removes it.
    hub = make_hub("c.GPUDockerSpawner.remove = False\n" + RECONCILE_FAST,
                   env={"GPUHUB_SIMULATED_GPUS": "1"})
    hub.create_user("kept")
    first = hub.start_server("kept", {"profile": "tf-gpu-1"})["state"]
    hub.stop_server("kept")
    second = hub.start_server("kept", {"profile": "tf-gpu-1"})["state"]
    assert second["gpu_uuids"] == first["gpu_uuids"] and second["gpu_lease_id"] != first["gpu_lease_id"]
    hub.wait_reconcile_passes(2)
    server = hub.server_model("kept")
    assert server and server["ready"], hub.log_tail(40)
    container = container_of(hub, docker_client, "kept")
    assert container.status == "running"
    assert container.labels[LABEL_LEASE] == str(second["gpu_lease_id"])
    assert [lease.id for lease in hub.ledger().leases()] == [second["gpu_lease_id"]]


def test_a_server_whose_saved_state_lost_its_lease_keeps_it_after_a_hub_restart(make_hub, docker_client):
    # A hub killed mid-spawn saved the server's state before its lease existed,
    # while the container it started carries the lease.  After the restart the
    # hub finds the server up: it must adopt the lease, not let a reconcile pass
    # remove the container of a server it still lists as running.
    hub = make_hub(RECONCILE_FAST)
    hub.create_user("lost")
    lease_id = hub.start_server("lost", {"profile": "tf-gpu-1"})["state"]["gpu_lease_id"]
    hub.kill()
    db = sqlite3.connect(hub.directory / "jupyterhub.sqlite")
    (state,) = db.execute("SELECT spawners.state FROM spawners JOIN users ON users.id = spawners.user_id "
                          "WHERE users.name = 'lost'").fetchone()
    state = {k: v for k, v in json.loads(state).items() if not k.startswith("gpu_")}
    db.execute("UPDATE spawners SET state = ? WHERE user_id = (SELECT id FROM users WHERE name = 'lost')",
               (json.dumps(state),))
    db.commit()
    db.close()

    passes_before = hub.log_tail(100000).count("GPU reconcile pass")
    hub.start()
    wait_for(lambda: hub.log_tail(100000).count("GPU reconcile pass") >= passes_before + 2, timeout=30,
             what="two reconcile passes after the restart", hub=hub)
    server = hub.server_model("lost")
    assert server and server["ready"], hub.log_tail(40)
    assert server["state"].get("gpu_lease_id") == lease_id
    assert container_of(hub, docker_client, "lost").status == "running"
    assert [lease.id for lease in hub.ledger().leases()] == [lease_id]
    # The adopted lease ends with the server, as any lease does.
    hub.stop_server("lost", token=hub.user_token("lost"))
    wait_for(lambda: not hub.ledger().leases(), timeout=30, what="the adopted lease to end", hub=hub)
    assert hub.ledger().lease(lease_id).end_reason == "stopped"


def test_a_reconcile_pass_during_a_stop_leaves_the_lease_to_the_stop(make_hub, docker_client, docker_faults):
    # Between the container's removal and the stop's own release of the lease
    # (it first asks Docker that nothing given the lease still runs), reconcile
    # passes run: the lease is the stop's to end, with the stop's reason.
    hub = make_hub(RECONCILE_FAST, env={"DOCKER_HOST": docker_faults.url})
    hub.create_user("slow")
    lease_id = hub.start_server("slow", {"profile": "tf-gpu-1"})["state"]["gpu_lease_id"]
    # Once the container is removed, the next listing (the stop's check) takes 3 s:
    # about three reconcile passes.
    docker_faults.after("DELETE", r"/containers/[^/]+$",
                        lambda: docker_faults.after("GET", r"/containers/json$",
                                                    lambda: time.sleep(3)))  # a slow answer
    hub.stop_server("slow", token=hub.user_token("slow"))
    wait_for(lambda: not hub.ledger().lease(lease_id).active, timeout=30, what="the lease to end", hub=hub)
    assert hub.ledger().lease(lease_id).end_reason == "stopped", hub.log_tail(40)


def _service_pids(hub_pid: int) -> dict[str, int]:
    """The hub's managed services (their module names) -> pid, from /proc."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        for module in (b"spawner.culling", b"spawner.poolpage"):
            if ppid == hub_pid and module in cmdline:
                found[module.decode()] = int(entry.name)
    return found


def test_the_hubs_services_stop_when_the_hub_is_killed(make_hub):
    # A hub killed with SIGKILL leaves its services behind with tokens the next
    # hub does not know (and the pool page holding its port): they stop themselves.
    hub = make_hub(env={"GPUHUB_CULL": "true"})
    services = wait_for(lambda: (lambda found: found if len(found) == 2 else None)(_service_pids(hub.process.pid)),
                        timeout=30, what="the culler and the pool page to run", hub=hub)
    hub.kill()

    def gone() -> bool:
        return not any(Path(f"/proc/{pid}").exists() and "zombie" not in _state(pid) for pid in services.values())

    wait_for(gone, timeout=20, what=f"the orphaned services {services} to stop", hub=hub)
    # The restarted hub runs its own, working services.
    hub.start()
    assert hub.api("GET", "/services/gpu-pool").status_code == 200
    assert requests.get(f"{hub.url}/services/gpu-pool/api/gpus", timeout=10,
                        headers={"Authorization": f"token {hub.token}"}).status_code == 200


def _state(pid: int) -> str:
    try:
        return {"Z": "zombie"}.get((Path(f"/proc/{pid}") / "stat").read_text().rsplit(")", 1)[1].split()[0], "alive")
    except OSError:
        return "gone"


# The directory identity a login would put in auth_state, read from a file the
# test edits (the lowest layer: what the authenticator hands the spawner).
IDENTITY_HOOK = """
import json, pathlib
IDENTITIES = pathlib.Path({path!r})
def _identity(spawner, auth_state):
    spawner._auth_state = json.loads(IDENTITIES.read_text()).get(spawner.user.name, {{}})
c.Spawner.auth_state_hook = _identity
"""


@pytest.fixture
def identity_hub(make_hub, tmp_path):
    identities = tmp_path / "identities.json"
    identities.write_text("{}")

    def make(extra: str = "", **kwargs) -> tuple[Hub, callable]:
        hub = make_hub(IDENTITY_HOOK.format(path=str(identities)) + extra, **kwargs)

        def set_identity(user: str, uid: int | None = None, gid: int | None = None) -> None:
            known = json.loads(identities.read_text())
            known[user] = {k: v for k, v in (("uid_number", uid), ("gid_number", gid)) if v is not None}
            identities.write_text(json.dumps(known))

        return hub, set_identity

    return make


def home_owner(container) -> str:
    code, out = container.exec_run(["stat", "-c", "%u:%g", "/home/jovyan"])
    assert code == 0, out
    return out.decode().strip()


def can_write_home(container) -> bool:
    code, _ = container.exec_run(["sh", "-c", "touch /home/jovyan/probe && rm /home/jovyan/probe"])
    return code == 0


def test_a_home_whose_first_handover_failed_is_handed_over_next_time(identity_hub, docker_client,
                                                                     docker_faults):
    hub, set_identity = identity_hub(env={"DOCKER_HOST": docker_faults.url})
    hub.create_user("hana")
    set_identity("hana", 23456, 23456)
    # The hand-over container never starts (the first start call of this spawn).
    docker_faults.fail("POST", r"/containers/[^/]+/start$", 500, "injected: start failed", times=1)
    hub.refused_spawn("hana", {"profile": "tf-cpu"})
    docker_faults.clear()
    hub.start_server("hana", {"profile": "tf-cpu"})
    container = container_of(hub, docker_client, "hana")
    assert home_owner(container) == "23456:23456"
    assert can_write_home(container)


def test_a_home_changes_owner_once_and_is_never_given_to_the_fallback_uid(identity_hub, docker_client,
                                                                          docker_faults):
    hub, set_identity = identity_hub(env={"DOCKER_HOST": docker_faults.url})
    hub.create_user("ivo")
    set_identity("ivo", 23457, 23457)
    hub.start_server("ivo", {"profile": "tf-cpu"})
    hub.stop_server("ivo")
    # The directory gives ivo a new uid: his home follows, once.
    set_identity("ivo", 34567, 34567)
    hub.start_server("ivo", {"profile": "tf-cpu"})
    container = container_of(hub, docker_client, "ivo")
    assert home_owner(container) == "34567:34567" and can_write_home(container)
    hub.stop_server("ivo")
    docker_faults.seen.clear()
    hub.start_server("ivo", {"profile": "tf-cpu"})
    creates = [p for m, p in docker_faults.seen if m == "POST" and p.endswith("/containers/create")]
    assert len(creates) == 1, f"an unchanged home was handed over again: {creates}"
    hub.stop_server("ivo")

    # No directory identity this time (no auth_state): refused, not remapped to uid 1000.
    set_identity("ivo")
    _, message = hub.refused_spawn("ivo", {"profile": "tf-cpu"})
    assert "log in again" in message
    volume = docker_client.volumes.get(f"{hub.prefix}-home-ivo")
    owner = docker_client.containers.run(hub.env["GPUHUB_CPU_IMAGE"], entrypoint=["stat", "-c", "%u", "/h"],
                                         volumes={volume.name: {"bind": "/h", "mode": "ro"}},
                                         network_mode="none", remove=True)
    assert owner.decode().strip() == "34567"


@pytest.mark.parametrize("uid, gid, what", [(0, 1000, "uidNumber 0"), (23458, 0, "gidNumber 0"),
                                             (-5, 1000, "uidNumber -5")])
def test_directory_identities_that_would_run_as_root_are_refused(identity_hub, docker_client, uid, gid, what):
    hub, set_identity = identity_hub()
    hub.create_user("rooty")
    set_identity("rooty", uid, gid)
    _, message = hub.refused_spawn("rooty", {"profile": "tf-gpu-1"})
    assert what in message and "will not run a server as" in message
    assert hub.containers(docker_client) == []
    assert hub.ledger().history(user="rooty") == []  # refused before any lease


# ------------------------------------------------------------ the hub's limits

def test_a_busy_pool_is_not_a_hub_failure(make_hub):
    # Three "all GPUs are lent" answers in a row with consecutive_failure_limit 2:
    # the hub must not count them as failures (and exit).
    hub = make_hub("c.Spawner.consecutive_failure_limit = 2\n",
                   env={"GPUHUB_SIMULATED_GPUS": "1", "GPUHUB_LEASE_WAIT_TIMEOUT": "1"})
    for user in ("holder", "w1", "w2", "w3"):
        hub.create_user(user)
    hub.start_server("holder", {"profile": "tf-gpu-1"})
    for user in ("w1", "w2", "w3"):
        r = hub.api("POST", f"/users/{user}/server", json={"profile": "tf-gpu-1"})
        assert r.status_code == 429, r.text
        assert "lent" in r.json()["message"]
    # JupyterHub counts a failure (and logs its warning, then "Aborting", exiting 2 s later) in a
    # callback that runs before the refused request's answer is written: by now it would show.
    log = hub.log_path.read_text(errors="replace")
    assert "consecutive spawns failed" not in log and "Aborting due to" not in log, hub.log_tail(40)
    assert hub.process.poll() is None, hub.log_tail(40)
    assert hub.api("GET", "/").status_code == 200


def test_cpu_spawns_start_while_gpu_spawns_wait_under_the_spawn_limit(make_hub):
    hub = make_hub("c.JupyterHub.concurrent_spawn_limit = 2\n", env={"GPUHUB_SIMULATED_GPUS": "1"})
    for user in ("holder", "q1", "q2", "cpu"):
        hub.create_user(user)
    hub.start_server("holder", {"profile": "tf-gpu-1"})
    for user in ("q1", "q2"):
        r = hub.api("POST", f"/users/{user}/server", json={"profile": "tf-gpu-1"})
        assert r.status_code == 202, r.text
    wait_for(lambda: len(hub.ledger().queue()) == 2, what="two queued GPU spawns", hub=hub)
    # Two spawns are pending, JupyterHub's limit; but they only wait for GPUs.
    server = hub.start_server("cpu", {"profile": "tf-cpu"})
    assert server["ready"]
    assert len(hub.ledger().queue()) == 2


# ------------------------------------------------------ an unanswering database

def test_a_ledger_that_stops_answering_never_freezes_the_hub(make_hub, postgres_url, blackhole_proxy, docker_client):
    from sqlalchemy.engine import make_url

    real = make_url(postgres_url)
    hole = blackhole_proxy(real.port)
    hub = make_hub("c.GPUDockerSpawner.ledger_timeout = 3\n",
                   env={"GPUHUB_POOL_DB_URL": real.set(port=hole.port).render_as_string(hide_password=False)})
    hub.create_user("gina")
    hub.create_user("hugo")
    hub.start_server("gina", {"profile": "tf-gpu-1"})
    hole.blackhole()  # no answer, and no TCP reset, ever

    r = hub.api("POST", "/users/hugo/server", json={"profile": "tf-gpu-1"}, timeout=30)
    assert r.status_code == 503, r.text
    assert "did not answer" in r.json()["message"]
    # Meanwhile the hub answers at once, again and again.
    for _ in range(5):
        assert hub.api("GET", "/", timeout=1).status_code == 200
    session = requests.Session()
    session.get(f"{hub.url}/hub/login", timeout=5)
    session.post(f"{hub.url}/hub/login", data={"username": "hugo", "password": "test-password-not-secret",
                                               "_xsrf": session.cookies.get("_xsrf")}, timeout=5)
    form = session.get(f"{hub.url}/hub/spawn", timeout=10)
    assert form.status_code == 200 and "availability unknown right now" in form.text
    # A CPU server needs no ledger.
    assert hub.start_server("hugo", {"profile": "tf-cpu"})["ready"]
    hub.api("GET", "/", timeout=1)
