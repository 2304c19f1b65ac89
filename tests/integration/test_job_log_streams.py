"""Following a job's log through the gpu-pool service (real hub, ledger, dockerd): followers
are capped, a follower that goes away ends its Docker stream and thread, and a dockerd that
freezes never stops the service's other pages."""

from __future__ import annotations

import socket
import threading
from urllib.parse import urlparse

import requests

from ..fixtures.hub import Hub, wait_for
from .test_jobs import job_hub, submit
from .test_poolpage import page_api
from .test_poolpage_resources import service_pid, threads

TICKING = ["sh", "-c", "while :; do echo tick; sleep 0.2; done"]
LIMITS = """
c.PoolServiceLimits.log_followers_per_user = 2
c.PoolServiceLimits.log_followers_per_job = 3
c.PoolServiceLimits.docker_timeout = 3
"""


def follow(hub: Hub, token: str, job_id: int) -> socket.socket:
    """A raw follower: sends the request, reads until the first output, keeps the socket."""
    address = urlparse(hub.url)
    sock = socket.create_connection((address.hostname, address.port), timeout=30)
    sock.sendall(f"GET /services/gpu-pool/api/jobs/{job_id}/logs?follow=1 HTTP/1.1\r\n"
                 f"Host: {address.hostname}\r\nAuthorization: token {token}\r\n\r\n".encode())
    got = b""
    while b"tick" not in got:
        chunk = sock.recv(65536)
        assert chunk, got
        got += chunk
    assert got.startswith(b"HTTP/1.1 200"), got[:300]
    return sock


def follow_once_free(hub: Hub, token: str, job_id: int) -> socket.socket:
    """A follower, once a place is free (the service hears of a follower that left at once,
    but not before the next request can arrive)."""
    def attempt():
        try:
            return follow(hub, token, job_id)
        except AssertionError as exc:
            assert b" 429 " in str(exc).encode() or "429" in str(exc), exc
            return None
    return wait_for(attempt, timeout=30, hub=hub, what="a follower's place to be free")


def refused(hub: Hub, token: str, job_id: int) -> requests.Response:
    r = page_api(hub, "GET", f"api/jobs/{job_id}/logs?follow=1", token, stream=True)
    assert r.status_code == 429, (r.status_code, r.raw.read(300))
    return r


def test_followers_are_capped_and_those_that_leave_end_their_streams(make_hub):
    hub, tokens = job_hub(make_hub, env={"GPUHUB_ADMIN_USERS": "ada"}, users=("pat", "ada"), extra_config=LIMITS)
    pat, ada = tokens["pat"], tokens["ada"]
    job = submit(hub, pat, {"profile": "tf-cpu", "command": TICKING})
    pid = service_pid(hub)
    follow(hub, pat, job["id"]).close()  # warm up: the thread pools that open streams
    before = threads(pid)

    # Per user: pat's third is refused, with the limit and what to do.
    held = [follow(hub, pat, job["id"]) for _ in range(2)]
    message = refused(hub, pat, job["id"]).json()["message"]
    assert "log_followers_per_user = 2" in message and "close one" in message
    # Per job: a third follower of the job (ada) is let in, a fourth refused.
    held.append(follow(hub, ada, job["id"]))
    assert "log_followers_per_job = 3" in refused(hub, ada, job["id"]).json()["message"]

    # Followers that leave free their places and end their Docker streams (the job runs on).
    for sock in held:
        sock.close()
    for _ in range(10):
        follow_once_free(hub, pat, job["id"]).close()
    # (13 followers came and went; a thread pool may have grown by a thread meanwhile)
    wait_for(lambda: threads(pid) <= before + 3, timeout=30, hub=hub,
             what=f"the service's threads back to about {before} (now {threads(pid)})")
    again = [follow_once_free(hub, pat, job["id"]) for _ in range(2)]
    for sock in again:
        sock.close()


def test_a_follower_of_a_queued_job_streams_once_it_runs(make_hub):
    hub, tokens = job_hub(make_hub, env={"GPUHUB_SIMULATED_GPUS": "1"}, users=("pat", "bob"))
    pat = tokens["pat"]
    hub.start_server("bob", {"profile": "tf-gpu-1"})
    job = submit(hub, pat, {"profile": "tf-gpu-1", "command": TICKING})
    wait_for(lambda: hub.ledger().queue(), hub=hub, what="the job queued")
    got = {}
    reader = threading.Thread(target=lambda: got.setdefault("sock", follow(hub, pat, job["id"])))
    reader.start()
    hub.stop_server("bob")  # its GPU goes to the job, which starts: the follower hears it
    reader.join(120)
    assert "sock" in got, "the follower of the queued job never got its output"
    got["sock"].close()


def test_a_frozen_dockerd_never_stops_the_services_pages(make_hub, docker_faults):
    hub, tokens = job_hub(make_hub, env={"DOCKER_HOST": docker_faults.url}, extra_config=LIMITS)
    pat = tokens["pat"]
    job = submit(hub, pat, {"profile": "tf-cpu", "command": TICKING})
    wait_for(lambda: "tick" in page_api(hub, "GET", f"api/jobs/{job['id']}/logs", pat).text, hub=hub,
             what="the job's container running")
    docker_faults.freeze()  # from now on dockerd answers nobody
    frozen_at = len(docker_faults.seen)
    results = {}

    def call(name, method, path):
        try:
            results[name] = page_api(hub, method, path, pat)
        except requests.RequestException as exc:
            results[name] = exc

    callers = [threading.Thread(target=call, args=a) for a in [
        ("follow", "GET", f"api/jobs/{job['id']}/logs?follow=1"),
        ("log", "GET", f"api/jobs/{job['id']}/logs"),
        ("page", "GET", f"jobs/{job['id']}"),
    ]]
    for c in callers:
        c.start()
    # The follower's Docker client asks the daemon's version first (then the log).
    wait_for(lambda: any(p.endswith(("/version", "/logs")) for _, p in docker_faults.seen[frozen_at:]), hub=hub,
             what="the service asking the frozen dockerd for the log")
    for _ in range(10):
        fresh = hub.user_token("pat")  # a token the service has not seen: it asks the hub too
        r = requests.get(f"{hub.url}/services/gpu-pool/api/gpus", headers={"Authorization": f"token {fresh}"},
                         timeout=2)
        assert r.status_code == 200, r.text
    wait_for(lambda: "follow" in results, timeout=60, hub=hub, what="the follower's answer")
    follow_answer = results["follow"]
    assert follow_answer.status_code == 503, follow_answer.text
    assert "Docker did not open job" in follow_answer.json()["message"]
    docker_faults.clear()
    for c in callers:
        c.join(120)
