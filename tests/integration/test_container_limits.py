"""Every container the project makes is bounded (c.ContainerLimits), on the real dockerd:
servers, jobs, the home hand-over helpers and the doctor's probe get a pids limit and a
size-capped log; a fork bomb stays inside its job, and a job that prints a lot keeps
only the last few MiB on disk."""

from __future__ import annotations

from ..fixtures.hub import wait_for
from .test_doctor import by_check, doctor, hub_env  # noqa: F401 (fixture)
from .test_gpu_spawner import container_of
from .test_jobs import job, job_containers, job_hub, jobs_api, submit, wait_state

BOUNDS = """
c.ContainerLimits.pids_limit = 64
c.ContainerLimits.log_max_size = "1m"
c.ContainerLimits.log_max_files = 2
"""
BOUNDED_LOG = {"Type": "json-file", "Config": {"max-file": "2", "max-size": "1m"}}


def bounds(attrs: dict) -> tuple:
    host = attrs["HostConfig"]
    return host.get("PidsLimit"), host.get("LogConfig")


def test_servers_jobs_and_home_helpers_are_bounded_and_a_fork_bomb_stays_in_its_job(
        make_hub, docker_client, docker_faults):
    from spawner.engines.common.labels import LABEL_SERVER, LABEL_USER

    hub, tokens = job_hub(make_hub, env={"DOCKER_HOST": docker_faults.url}, extra_config=BOUNDS)
    pat = tokens["pat"]
    # A home volume without an owner's marker or label: the hub hands it over, through
    # short-lived helper containers (one reads the marker, one copies and chowns).
    docker_client.volumes.create(f"{hub.prefix}-home-pat")
    helpers: dict[str, tuple] = {}

    def record_helpers():
        for c in docker_client.containers.list(all=True, filters={"label": f"{LABEL_USER}=pat"},
                                               ignore_removed=True):
            if LABEL_SERVER not in c.labels:
                helpers[c.id] = bounds(c.attrs)

    docker_faults.after("POST", r"/containers/create$", record_helpers, times=3)
    hub.start_server("pat", {"profile": "tf-cpu"})
    assert len(helpers) == 2 and all(v == (64, BOUNDED_LOG) for v in helpers.values()), helpers
    server = container_of(hub, docker_client, "pat")
    assert bounds(server.attrs) == (64, BOUNDED_LOG)
    hub.stop_server("pat")

    # A fork bomb, bounded: 200 processes asked for, 64 allowed; the host is untouched.
    bomb = submit(hub, pat, {"profile": "tf-cpu", "command": [
        "sh", "-c", "for i in $(seq 200); do sleep 30 & done; echo spawned; wait"]})
    wait_for(lambda: "fork" in jobs_api(hub, "GET", f"/{bomb['id']}/logs", pat).text.lower(), hub=hub,
             what="the fork bomb to hit its pids limit")
    boxes = job_containers(hub, docker_client, bomb["id"])  # (gone once the job has ended)
    assert all(bounds(box.attrs) == (64, BOUNDED_LOG) for box in boxes)
    assert jobs_api(hub, "DELETE", f"/{bomb['id']}", pat).status_code in (200, 409)
    assert wait_state(hub, pat, bomb["id"], ("failed", "succeeded", "cancelled"), timeout=60)

    # 3 MB of output, in 16 KiB log entries: 2 files of 1 MiB are kept on disk, no more.
    loud = submit(hub, pat, {"profile": "tf-cpu", "command": [
        "sh", "-c", "head -c 3000000 /dev/zero | tr '\\0' y; echo; echo THE-END; sleep 300"]})
    wait_for(lambda: "THE-END" in jobs_api(hub, "GET", f"/{loud['id']}/logs", pat).text[-100:], hub=hub,
             what="the loud job's output")
    [box] = job_containers(hub, docker_client, loud["id"])
    assert bounds(box.attrs) == (64, BOUNDED_LOG)
    kept = box.logs()
    assert b"THE-END" in kept[-100:] and len(kept) <= 2 * 1024 * 1024 + 64 * 1024, len(kept)
    assert job(hub, pat, loud["id"])["state"] == "running"
    assert jobs_api(hub, "DELETE", f"/{loud['id']}", pat).status_code == 200


def test_the_doctors_probe_is_bounded(hub_env, docker_client, docker_faults):  # noqa: F811
    from spawner.cli.doctor import LABEL_DOCTOR

    seen = []

    def record_probe():
        seen.extend(bounds(c.attrs) for c in docker_client.containers.list(
            all=True, filters={"label": LABEL_DOCTOR}, ignore_removed=True))

    docker_faults.after("POST", r"/containers/[^/]+/start$", record_probe)
    code, results, _ = doctor(dict(hub_env, DOCKER_HOST=docker_faults.url))
    assert by_check(results)["one-GPU container"]["status"] == "ok", results
    # The defaults (no c.ContainerLimits here): a helper's 64 processes, 3 log files of 10 MB, for
    # the GPU probe and each image's look inside.
    expected = (64, {"Type": "json-file", "Config": {"max-size": "10m", "max-file": "3"}})
    assert seen and all(s == expected for s in seen), seen
