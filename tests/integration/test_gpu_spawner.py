"""GPUDockerSpawner through a real hub, real dockerd and the ledger.

GPUs are simulated (no NVIDIA hardware here), but the device request goes
through the real daemon: its NVIDIA driver (with the test double of the
hook) sets NVIDIA_VISIBLE_DEVICES in the container exactly as on a GPU host.
"""

from __future__ import annotations

import json

import pytest
import requests

from ..fixtures.hub import Hub, wait_for


def visible_devices(container) -> str:
    """NVIDIA_VISIBLE_DEVICES as the notebook server (PID 1's tree) sees it.

    The daemon's NVIDIA driver sets it in the container's process spec, which
    `docker exec` does not inherit, so read PID 1's environment."""
    from spawner.cli.doctor import visible_devices as from_environ

    code, out = container.exec_run(["cat", "/proc/1/environ"])
    assert code == 0, out
    return from_environ(out)


def container_of(hub: Hub, docker_client, user: str, server_name: str = ""):
    name = f"{hub.prefix}-{user}" + (f"-{server_name}" if server_name else "")
    matches = [c for c in hub.containers(docker_client) if c.name == name]
    assert matches, f"no container {name}: {[c.name for c in hub.containers(docker_client)]}"
    return matches[0]


def test_gpu_profiles_see_exactly_their_leased_gpus(make_hub, docker_client):
    hub = make_hub()
    for user in ("ann", "bob", "cat"):
        hub.create_user(user)
    hub.start_server("ann", {"profile": "tf-gpu-1"})
    hub.start_server("bob", {"profile": "tf-gpu-2"})
    hub.start_server("cat", {"profile": "tf-cpu"})

    seen = {}
    for user, count in (("ann", 1), ("bob", 2)):
        state = hub.server_model(user)["state"]
        assert len(state["gpu_uuids"]) == count
        devices = visible_devices(container_of(hub, docker_client, user))
        assert devices.split(",") == state["gpu_uuids"]
        seen[user] = set(state["gpu_uuids"])
    # Two users never share a GPU.
    assert not seen["ann"] & seen["bob"]

    # A CPU profile gets no GPU at all.
    cpu = container_of(hub, docker_client, "cat")
    assert visible_devices(cpu) == "void"
    assert not cpu.attrs["HostConfig"].get("DeviceRequests")
    assert "gpu_lease_id" not in hub.server_model("cat")["state"]

    active = {lease.user: set(lease.gpu_uuids) for lease in hub.ledger().leases()}
    assert active == seen


def test_container_is_locked_down(make_hub, docker_client):
    hub = make_hub()
    hub.create_user("dan")
    hub.start_server("dan", {"profile": "tf-gpu-1"})
    container = container_of(hub, docker_client, "dan")
    host = container.attrs["HostConfig"]
    assert host["CapDrop"] == ["ALL"]
    assert not host.get("CapAdd")
    assert "no-new-privileges" in host["SecurityOpt"]
    assert not host["Privileged"]
    assert host["ShmSize"] >= 1 << 30
    assert not any("docker.sock" in (m.get("Source") or "") for m in container.attrs["Mounts"])
    code, out = container.exec_run(["id", "-u"])
    assert out.decode().strip() != "0"
    env = dict(line.split("=", 1) for line in container.attrs["Config"]["Env"])
    assert env["OMP_NUM_THREADS"] == "2"  # the profile's cpu_limit
    # Home is the user's named volume.
    assert any(m["Type"] == "volume" and m["Destination"] == "/home/jovyan" for m in container.attrs["Mounts"])


def _progress_messages(hub: Hub, user: str, until: str, timeout: float = 30) -> list[str]:
    messages = []
    with hub.api("GET", f"/users/{user}/server/progress", stream=True, timeout=timeout) as r:
        assert r.status_code == 200
        for raw in r.iter_lines(decode_unicode=True):
            if raw and raw.startswith("data:"):
                event = json.loads(raw[5:])
                messages.append(event.get("message", ""))
                if until in event.get("message", ""):
                    break
    return messages


def test_exhausted_pool_queues_then_starts_when_a_gpu_frees(make_hub, docker_client):
    hub = make_hub()
    for user in ("eve", "fay", "gus"):
        hub.create_user(user)
    hub.start_server("eve", {"profile": "tf-gpu-2"})
    hub.start_server("fay", {"profile": "tf-gpu-2"})

    r = hub.api("POST", "/users/gus/server", json={"profile": "tf-gpu-1"})
    assert r.status_code == 202, r.text  # not ready: queued
    messages = _progress_messages(hub, "gus", until="in the queue")
    assert any("1st in the queue" in m for m in messages), messages
    assert hub.server_model("gus")["pending"] == "spawn"
    assert len(hub.ledger().queue()) == 1

    freed = set(hub.server_model("eve")["state"]["gpu_uuids"])
    hub.stop_server("eve")
    server = hub.wait_ready("gus", timeout=60)
    assert set(server["state"]["gpu_uuids"]) <= freed
    assert visible_devices(container_of(hub, docker_client, "gus")).split(",") == server["state"]["gpu_uuids"]


STOP_PATHS_CONFIG = """
c.JupyterHub.services.append({"name": "idle-culler", "api_token": "culler-token-0123456789abcdef"})
c.JupyterHub.load_roles.append({"name": "culler", "scopes": ["list:users", "delete:servers"],
                                "services": ["idle-culler"]})
c.Spawner.poll_interval = 1
"""


def _reason_of_last_lease(hub: Hub, user: str) -> str:
    history = [lease for lease in hub.ledger().history(user=user)]
    assert history, f"no lease history for {user}"
    last = max(history, key=lambda lease: lease.started_at)
    assert last.ended_at is not None, f"lease {last.id} of {user} still active"
    return last.end_reason


def test_every_way_a_server_ends_releases_its_lease(make_hub, docker_client):
    hub = make_hub(STOP_PATHS_CONFIG)
    users = ["by-user", "by-admin", "culled", "crashed", "removed", "at-shutdown"]
    for user in users:
        hub.create_user(user)
    hub.create_user("boss", admin=True)
    for user in users[:4]:
        hub.start_server(user, {"profile": "tf-gpu-1"})

    hub.stop_server("by-user", token=hub.user_token("by-user"))
    assert _reason_of_last_lease(hub, "by-user") == "stopped"

    # The hub names no requester to a spawner: an admin's stop through the hub's own API or
    # admin panel is `stopped`; the pool page's "end lease" (test_poolpage_actions) is `admin`.
    hub.stop_server("by-admin", token=hub.user_token("boss"))
    assert _reason_of_last_lease(hub, "by-admin") == "stopped"

    # The culler records its intent in the ledger, then asks the hub (as the real one does,
    # test_culling); a fresh intent gives the lease its reason.
    lease_id = hub.server_model("culled")["state"]["gpu_lease_id"]
    assert hub.ledger().record_end_intent(lease_id, "culled", "idle-culler")
    hub.stop_server("culled", token="culler-token-0123456789abcdef")
    assert _reason_of_last_lease(hub, "culled") == "culled"

    # The container crashes: the hub's poll notices and the lease ends.
    container_of(hub, docker_client, "crashed").kill()
    hub.wait_stopped("crashed", timeout=30)
    wait_for(lambda: not hub.ledger().leases(user="crashed"), what="crashed lease to end")
    assert _reason_of_last_lease(hub, "crashed") == "died"

    # Removed behind the hub's back.
    hub.start_server("removed", {"profile": "tf-gpu-1"})
    container_of(hub, docker_client, "removed").remove(force=True)
    hub.wait_stopped("removed", timeout=30)
    wait_for(lambda: not hub.ledger().leases(user="removed"), what="removed lease to end")
    assert _reason_of_last_lease(hub, "removed") == "died"

    # Hub shutdown (cleanup_servers=True) stops servers and ends their leases.
    hub.start_server("at-shutdown", {"profile": "tf-gpu-1"})
    hub.stop()
    assert hub.ledger().leases() == []
    assert _reason_of_last_lease(hub, "at-shutdown") == "stopped"
    assert hub.containers(docker_client) == []


BAD_OPTIONS = [
    ({"profile": "no-such-profile"}, 400, "Unknown profile"),
    ({"profile": 7}, 400, "must be a string"),
    ({"profile": "tf-gpu-1", "image": "evil/image"}, 400, "'image'"),
    ({"profile": "tf-gpu-1", "env": {"NVIDIA_VISIBLE_DEVICES": "all"}}, 400, "'env'"),
    ({"profile": "tf-gpu-1", "gpus": 4}, 400, "'gpus'"),
    ({"profile": "tf-gpu-1", "volumes": {"/var/run/docker.sock": "/d"}}, 400, "'volumes'"),
    ({"profile": "staff-only"}, 403, "staff"),
    ({"profile": "tf-gpu-2"}, 403, "limit"),
    ({"profile": "huge"}, 400, "4"),
    ({"profile": "x" * 5000}, 400, "Unknown profile"),
    ({"profile": "tf-cpu\u0000)(uid=*"}, 400, "Unknown profile"),
]

BAD_OPTIONS_CONFIG = """
c.GPUDockerSpawner.profiles = c.GPUDockerSpawner.profiles + [
    {"slug": "staff-only", "display_name": "Staff", "image": c.GPUDockerSpawner.profiles[0]["image"],
     "gpus": 1, "groups": ["staff"]},
    {"slug": "huge", "display_name": "Eight GPUs", "image": c.GPUDockerSpawner.profiles[0]["image"], "gpus": 8},
]
"""


def test_bad_options_get_clear_errors_and_leak_nothing(make_hub, docker_client):
    hub = make_hub(BAD_OPTIONS_CONFIG, env={"GPUHUB_MAX_GPUS_PER_USER": "1"})
    hub.create_user("mallory")
    for options, status, fragment in BAD_OPTIONS:
        r = hub.api("POST", "/users/mallory/server", json=options)
        assert r.status_code == status, (options, r.status_code, r.text)
        message = r.json().get("message", "")
        assert fragment in message, (options, message)
        assert "Traceback" not in r.text
        assert hub.server_model("mallory") is None
    # Not a JSON object at all.
    r = hub.api("POST", "/users/mallory/server", data="[1, 2]")
    assert r.status_code == 400, r.text
    assert hub.ledger().leases() == [] and hub.ledger().queue() == []
    assert hub.containers(docker_client) == []
    # And the user can still start a server they are allowed.
    hub.start_server("mallory", {"profile": "tf-gpu-1"})


def test_named_servers_share_the_users_gpu_quota(make_hub):
    hub = make_hub("c.JupyterHub.allow_named_servers = True\n", env={"GPUHUB_MAX_GPUS_PER_USER": "1"})
    hub.create_user("nina")
    hub.start_server("nina", {"profile": "tf-gpu-1"}, server_name="first")
    r = hub.api("POST", "/users/nina/servers/second", json={"profile": "tf-gpu-1"})
    assert r.status_code == 403, r.text
    assert "limit" in r.json()["message"]
    assert len(hub.ledger().leases(user="nina")) == 1


def test_hub_killed_mid_spawn_leaves_ledger_matching_docker(make_hub, docker_client):
    hub = make_hub()
    hub.create_user("pete")
    r = hub.api("POST", "/users/pete/server", json={"profile": "tf-gpu-1"})
    assert r.status_code in (201, 202)
    wait_for(lambda: hub.ledger().leases(user="pete"), timeout=30, what="pete's lease")
    hub.kill()
    hub.start()

    def consistent():
        leases = {lease.id for lease in hub.ledger().leases()}
        running = {int(c.labels["org.jupyter.gpuhub.lease-id"]) for c in hub.containers(docker_client, all=False)
                   if c.labels.get("org.jupyter.gpuhub.lease-id")}
        tracked = set()
        server = hub.server_model("pete")
        if server and server.get("state", {}).get("gpu_lease_id") is not None:
            tracked.add(server["state"]["gpu_lease_id"])
        return leases == running == tracked

    wait_for(consistent, timeout=45, what="ledger, Docker and hub to agree")
    # And pete can start again.
    if hub.server_model("pete") is None:
        hub.start_server("pete", {"profile": "tf-gpu-1"})
    assert len(hub.ledger().leases(user="pete")) == 1


def test_spawn_form_lists_allowed_profiles_with_free_gpus(make_hub):
    hub = make_hub(BAD_OPTIONS_CONFIG)
    hub.create_user("quinn")
    session = requests.Session()
    r = session.get(f"{hub.url}/hub/login")
    xsrf = session.cookies.get("_xsrf")
    r = session.post(f"{hub.url}/hub/login", data={"username": "quinn", "password": "test-password-not-secret",
                                                   "_xsrf": xsrf})
    assert r.status_code == 200
    r = session.get(f"{hub.url}/hub/spawn")
    assert r.status_code == 200
    assert "TensorFlow + 1 GPU" in r.text and "4 of 4 free now" in r.text
    assert "staff-only" not in r.text  # a profile quinn's groups do not allow


def test_metrics_report_the_pool(make_hub):
    hub = make_hub()
    hub.create_user("rita")
    hub.start_server("rita", {"profile": "tf-gpu-1"})
    r = requests.get(f"{hub.url}/hub/metrics", headers={"Authorization": f"token {hub.token}"}, timeout=10)
    assert r.status_code == 200
    text = r.text
    assert 'gpuhub_gpus{state="lent"} 1.0' in text
    assert 'gpuhub_gpus{state="free"} 3.0' in text
    assert "gpuhub_lease_wait_seconds_count 1.0" in text


@pytest.fixture(scope="module")
def newer_cuda_image(docker_client, notebook_image):
    """The test image, labelled as needing a newer CUDA than the (simulated) driver's 12.4."""
    import io

    tag = "gpuhub/test-needs-cuda:13.9"
    dockerfile = f"FROM {notebook_image}\nLABEL org.jupyter.gpuhub.cuda-version=13.9\n"
    docker_client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True)
    return tag


def test_image_needing_newer_cuda_than_the_driver_is_refused(make_hub, docker_client, newer_cuda_image):
    hub = make_hub(f"""
c.GPUDockerSpawner.profiles = [{{"slug": "new-cuda", "display_name": "New CUDA",
                                 "image": {newer_cuda_image!r}, "gpus": 1}}]
""")
    hub.create_user("sam")
    _, message = hub.refused_spawn("sam", {"profile": "new-cuda"})
    assert "needs CUDA 13.9" in message and "supports up to 12.4" in message
    assert hub.ledger().history(user="sam") == []  # refused before any lease
    assert hub.containers(docker_client) == []


def test_kept_containers_are_recreated_when_the_gpus_differ(make_hub, docker_client):
    # DockerSpawner's remove=False restarts the old container as it was, GPU pinning
    # included; the spawner must not let that hand out a GPU the user no longer holds.
    hub = make_hub("c.GPUDockerSpawner.remove = False\n")
    hub.create_user("tia")
    first = hub.start_server("tia", {"profile": "tf-gpu-1"})["state"]["gpu_uuids"]
    hub.stop_server("tia")
    assert [c.status for c in hub.containers(docker_client)] == ["exited"]  # kept
    # Drain tia's old GPU, so her next lease is surely another one.
    hub.ledger().drain(first[0])
    second = hub.start_server("tia", {"profile": "tf-gpu-1"})["state"]["gpu_uuids"]
    assert second != first
    assert visible_devices(container_of(hub, docker_client, "tia")) == ",".join(second)


def test_unreachable_ledger_refuses_gpu_spawns_clearly_and_leaks_no_password(make_hub, docker_client):
    from ..fixtures.services import free_port

    secret = "s3cret-ledger-pass"
    hub = make_hub(env={"GPUHUB_POOL_DB_URL": f"postgresql+psycopg://gpuhub:{secret}@127.0.0.1:{free_port()}/ledger"})
    hub.create_user("vic")
    r = hub.api("POST", "/users/vic/server", json={"profile": "tf-gpu-1"})
    assert r.status_code == 503, r.text
    assert "unavailable" in r.json()["message"] and secret not in r.text
    assert hub.server_model("vic") is None and hub.containers(docker_client) == []
    # A CPU server needs no ledger and still starts.
    hub.start_server("vic", {"profile": "tf-cpu"})
    assert secret not in hub.log_path.read_text()
