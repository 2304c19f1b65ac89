"""Servers that borrow (issue 38): a profile's `borrow`, what JupyterLab and api/wait say of a
borrowed lease, and the gpu-pool service's reclaim of a borrowed server on a real SQLite ledger
(the hub's API is a recorder of the stops asked: the stop itself is the hub's, tested in
tests/integration/test_server_borrow.py)."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime, timedelta

import pytest

from devservices.waiting import async_until
from spawner.pool import EndReason
from spawner.pool.models import Lease
from spawner.poolpage.server_reclaim import RETRY_AFTER, ServerReclaims, borrowed_part
from spawner.profiles import Profile, ProfileConfigError, load_profiles, options_form_html
from spawner.services.hub_api import HubUnavailable

from .test_pool import make_pool

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
TWO = {"slug": "two", "display_name": "Two GPUs", "image": "i", "gpus": 2}


def test_a_profile_borrows_only_when_it_says_so():
    plain, borrowing = load_profiles([TWO, {**TWO, "slug": "two-b", "borrow": True}])
    assert plain.borrow is False and borrowing.borrow is True
    with pytest.raises(ProfileConfigError, match="'borrow' must be true or false"):
        Profile.from_config({**TWO, "borrow": "yes"})
    form = options_form_html([plain, borrowing], "", {"free": 4, "lent": 0})
    assert form.count("may borrow idle GPUs beyond your share") == 1


def lease(borrowed: bool, reclaim_at: datetime | None = None, server: str = "") -> Lease:
    return Lease(id=7, user="alice", server_name=server, host="h", gpu_uuids=("GPU-a", "GPU-b"), groups=(),
                 started_at=NOW - timedelta(minutes=5), borrowed=borrowed, reclaim_at=reclaim_at)


def test_what_a_borrowed_server_is_told_before_and_after_its_gpus_are_asked_back():
    assert borrowed_part(lease(False), 120, NOW) is None
    assert borrowed_part(lease(True), 120, NOW) == {
        "notice": "running on borrowed GPUs: may be reclaimed with 2 minutes' notice",
        "reclaim_at": None, "stops_at": None, "seconds_left": None}
    part = borrowed_part(lease(True, NOW - timedelta(seconds=30)), 120, NOW)
    assert part["stops_at"] == "2026-12-06T12:01:30+00:00" and part["seconds_left"] == 90
    assert part["notice"] == ("running on borrowed GPUs: a request within its share needs them; this server is "
                              "stopped at 12:01:30 UTC (in 90 s): save your work now")
    assert "this job is stopped" in borrowed_part(lease(True, NOW, "job/3"), 600, NOW)["notice"]
    assert "(in 10 min)" in borrowed_part(lease(True, NOW), 600, NOW)["notice"]
    assert borrowed_part(lease(True, NOW - timedelta(hours=1)), 120, NOW)["seconds_left"] == 0


class Hub:
    """The hub's API as the reclaim calls it: records each stop asked; `fail` makes it answer badly."""

    def __init__(self):
        self.stops: list[tuple[str, str]] = []
        self.fail = False

    async def stop_server(self, user: str, server: str) -> bool:
        if self.fail:
            raise HubUnavailable("The hub's API answered DELETE with 503")
        self.stops.append((user, server))
        return False


def test_a_borrowed_server_is_stopped_once_its_notice_is_over_and_its_lease_ends_reclaimed(tmp_path):
    pool = make_pool(tmp_path, max_gpus_per_user=1, group_gpu_limits={"ml": 4}, reclaim_grace=30)
    hub = Hub()
    reclaims = ServerReclaims(pool, hub)

    async def main():
        server = pool.try_acquire("alice", "big", 2, borrow=True)  # beyond her share of 1
        job = pool.try_acquire("carol", "job/4", 2, borrow=True)
        assert server.borrowed and job.borrowed
        bob = asyncio.ensure_future(pool.acquire("bob", "", 4, groups=["ml"], timeout=30))
        marked = await async_until(lambda: len(pool.reclaiming()) == 2 and pool.reclaiming(), 10,
                                   "both borrowed leases asked back")
        asked_at = next(m.reclaim_at for m in marked if m.id == server.id)
        # Within the notice: nothing is stopped, and nothing recorded.
        assert await reclaims.round(asked_at + timedelta(seconds=29)) == []
        assert hub.stops == [] and pool.end_intent(server.id) is None
        # Over: the server (never the job: the jobs runner's) is asked to stop, its end intent first.
        hub.fail = True
        assert await reclaims.round(asked_at + timedelta(seconds=30)) == []
        assert pool.end_intent(server.id)[0] == "reclaimed" and hub.stops == []
        hub.fail = False
        assert await reclaims.round(asked_at + timedelta(seconds=31)) == []  # asked a second ago: waits
        later = asked_at + timedelta(seconds=31 + RETRY_AFTER)
        assert await reclaims.round(later) == [server.id]
        assert hub.stops == [("alice", "big")]
        assert pool.end_intent(server.id) == ("reclaimed", "gpu-pool")
        assert await reclaims.round(later + timedelta(seconds=1)) == []  # asked once per retry time
        # The spawner ends the lease with the intent's reason once its container is gone.
        assert pool.release(server.id, EndReason(pool.end_intent(server.id)[0]))
        assert pool.release(job.id, EndReason.RECLAIMED)
        got = await asyncio.wait_for(bob, 10)
        assert len(got.gpu_uuids) == 4 and not got.borrowed
        assert pool.lease(server.id).end_reason == "reclaimed"
        assert await reclaims.round(later + timedelta(seconds=RETRY_AFTER * 2)) == [] and reclaims.asked == {}
        assert hub.stops == [("alice", "big")]

    try:
        asyncio.run(main())
    finally:
        with contextlib.suppress(Exception):
            pool.close()


def test_a_server_on_borrowed_gpus_is_refused_over_the_borrowing_limit(tmp_path):
    from spawner.pool import QuotaExceeded

    pool = make_pool(tmp_path, max_gpus_per_user=1, max_borrowed_gpus_per_user=2)
    try:
        with pytest.raises(QuotaExceeded, match=r"GPUPool.max_borrowed_gpus_per_user"):
            pool.check_request("alice", 3, borrow=True)
        assert pool.check_request("alice", 2, borrow=True) is True  # would borrow
        assert pool.check_request("alice", 1, borrow=True) is False  # within her share
        with pytest.raises(QuotaExceeded, match=r"at most 1 GPU"):
            pool.check_request("alice", 2)  # a profile that does not borrow: her quota
    finally:
        pool.close()


def test_the_service_gives_the_hubs_notice_with_jobs_off():
    import json

    from traitlets.config import Config

    from spawner.pool import GPUPool
    from spawner.settings.service_file import render_service_config

    class _Settings:
        jobs = False
        cull = True
        activity_interval = 0

    c = Config()
    assert "GPUPool" not in json.loads(render_service_config(c, _Settings()))  # the default: nothing written
    c.GPUPool.reclaim_grace = 15
    written = Config(json.loads(render_service_config(c, _Settings())))
    assert GPUPool(config=written, db_url="sqlite://").reclaim_grace == 15


class _SwarmAPI:
    """The manager's answers for one service, as docker-py's APIClient gives them."""

    def __init__(self, replicas: int, tasks: list[dict]):
        self.service = {"ID": "s1", "Version": {"Index": 3},
                        "Spec": {"Name": "gpuhub-job-7", "Labels": {}, "Mode": {"Replicated": {"Replicas": replicas}},
                                 "TaskTemplate": {"ContainerSpec": {"StopGracePeriod": int(40e9)}}}}
        self._tasks = tasks
        self.updates: list[dict] = []

    def inspect_service(self, name):
        return self.service

    def tasks(self, filters=None):
        return self._tasks

    def nodes(self):
        return [{"ID": "n1", "Status": {"State": "ready"}, "Description": {"Hostname": "gpu-a"}}]

    def update_service(self, service_id, version, **kwargs):
        self.updates.append(kwargs)
        self.service["Spec"]["Mode"] = {"Replicated": {"Replicas": kwargs["mode"]["replicated"]["Replicas"]}}


def test_on_swarm_a_borrowed_job_gets_its_notice_as_the_stop_grace_and_its_sigterm_from_the_scale_down():
    from spawner.engines.swarm.job_services import SwarmJobEngine, _stop_grace
    from spawner.jobs.engine import ENDED, RUNNING, UnitSpec
    from spawner.jobs.runner_settings import JobSettings

    settings = JobSettings(engine="swarm", prefix="gpuhub")
    engine = SwarmJobEngine(settings)
    spec = UnitSpec(name="gpuhub-job-7", image="img", command=["true"], user="1000:100", env={}, labels={},
                    working_dir="/home/jovyan", volumes={})
    assert engine.service_args(spec)["task_template"]["ContainerSpec"]["StopGracePeriod"] == int(5e9)
    borrowed = engine.service_args(UnitSpec(**{**spec.__dict__, "stop_grace": 40.0}))["task_template"]
    assert borrowed["ContainerSpec"]["StopGracePeriod"] == int(40e9)

    running = {"ID": "t1", "Version": {"Index": 5}, "NodeID": "n1", "Status": {"State": "running"}}
    engine = SwarmJobEngine(settings, api=_SwarmAPI(1, [running]))
    assert _stop_grace(engine.api.service) == 40.0
    assert engine._read("gpuhub-job-7").phase == RUNNING
    assert asyncio.run(engine.signal("gpuhub-job-7", "SIGKILL")) is False and engine.api.updates == []
    assert asyncio.run(engine.signal("gpuhub-job-7")) is True  # told: scaled to 0
    assert engine.api.updates[0]["mode"]["replicated"]["Replicas"] == 0
    # Its task heeded the notice and Swarm removed it: ended, not "no task yet".
    engine.api._tasks = []
    assert engine._read("gpuhub-job-7").phase == ENDED
    assert asyncio.run(engine.signal("gpuhub-job-7")) is False  # nothing left to tell


def test_the_reclaimed_notification_of_a_server_says_it_is_stopped_not_queued():
    from spawner.notify.message import Links, describe
    from spawner.pool.ledger import outbox

    links = Links("https://hub.example.org/", "https://hub.example.org/services/gpu-pool/", {})
    stops = datetime.now(UTC) + timedelta(seconds=110)
    payload = {"server_name": "", "job_id": None, "hosts": ["h"], "gpus": 2, "asked_at": NOW.isoformat(),
               "grace_s": 120.0, "stops_at": stops.isoformat()}
    title, facts, link = describe(outbox.Entry(1, "alice", "reclaimed", "email", payload, NOW, 0), links)
    assert title.startswith("Your server (default) runs on borrowed GPUs that are asked back: it stops in ")
    assert "save your work" in dict(facts)["Why"] and "requeue" not in dict(facts)["Why"]
    assert link == "https://hub.example.org/"


def test_the_spawner_borrows_only_with_a_borrowing_profile_and_says_so(tmp_path):
    """The lending spawner on a real ledger (three simulated GPUs; alice's share is 1): the spawn's
    check and lease ask to borrow exactly when the profile says so."""
    import types

    from tornado import web
    from traitlets.config import Config

    from spawner.engines.docker.spawner import GPUDockerSpawner
    from spawner.lending import spawner as lending

    c = Config()
    c.GPUPool.db_url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    c.GPUPool.max_gpus_per_user = 1
    c.GPUPool.max_borrowed_gpus_per_user = 2
    c.GPUPool.reclaim_grace = 120
    c.GPUDockerSpawner.inventory_kind = "simulated"
    c.SimulatedInventory.count = 3
    c.GPUDockerSpawner.profiles = [TWO, {**TWO, "slug": "two-b", "borrow": True},
                                   {**TWO, "slug": "three-b", "gpus": 3, "borrow": True}]
    user = types.SimpleNamespace(name="alice", groups=[], url="/user/alice/", id=1, settings={}, server=None)
    spawner = GPUDockerSpawner(user=user, config=c, orm_spawner=types.SimpleNamespace(name="", server=None))

    async def main():
        with pytest.raises(web.HTTPError) as refused:
            await spawner._apply_profile({"profile": "two"})
        assert refused.value.status_code == 403
        assert refused.value.log_message == (
            "You may hold at most 1 GPU (the per-user limit) and asked for 2. Profile 'two' does not borrow "
            "idle GPUs beyond your share (its `borrow` is off); a profile marked 'may borrow' does.")
        with pytest.raises(web.HTTPError) as over:
            await spawner._apply_profile({"profile": "three-b"})
        assert over.value.status_code == 403 and "GPUPool.max_borrowed_gpus_per_user" in over.value.log_message
        assert spawner.pool.leases() == []
        await spawner._apply_profile({"profile": "two-b"})
        await spawner.lease_for_start(spawner.profile)
        lease = spawner.pool.lease(spawner.lease_id)
        assert lease.borrowed and len(lease.gpu_uuids) == 2
        assert spawner.get_state()["gpu_borrowed"] is True
        assert {"progress": 41, "message": "running on borrowed GPUs: may be reclaimed with 2 minutes' notice"} \
            in spawner._progress_events

    try:
        asyncio.run(main())
    finally:
        pool = lending._shared_pools.pop(id(c), None)
        if pool is not None:
            pool.close()
