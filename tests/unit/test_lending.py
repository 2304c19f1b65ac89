"""The lease's life in the lending spawner, on a real ledger (SQLite) with a small fake engine.

`GPULendingSpawner` is what every engine shares: the lease around a start, the
reason a stop gives it, and the release once the engine confirms nothing given
it still runs.  These tests drive it the way JupyterHub does (`user_stop`
follows JupyterHub 6's `User.stop`), with an engine whose answers each test
chooses, so a mistake in the core shows here in seconds rather than in a
ten-minute end-to-end run.
"""

from __future__ import annotations

import asyncio
import types
from datetime import timedelta

import pytest
import sqlalchemy as sa
from jupyterhub.spawner import Spawner
from tornado import web
from traitlets.config import Config

from devservices.waiting import async_until
from spawner.lending import GPULendingSpawner, admission
from spawner.lending import spawner as lending
from spawner.pool import EndReason
from spawner.pool.ledger.schema import end_intents_table

pytestmark = pytest.mark.unit


class FakeEngine(Spawner):
    """What an engine's JupyterHub spawner does, reduced to flags a test sets."""

    running = True
    stop_raises: Exception | None = None

    async def start(self):  # the lending spawner's own start() runs instead
        raise AssertionError("not reached")

    async def poll(self):
        return None if self.running else 1

    async def stop(self, now=False):
        if self.stop_raises is not None:
            raise self.stop_raises
        self.running = False


class Lender(GPULendingSpawner, FakeEngine):
    """A lending spawner on the fake engine: `holders` are what `lease_holders` answers."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.holders: list[str] | Exception = []
        self.asked = 0  # how often the engine was asked who holds a lease
        self.start_gate: asyncio.Event | None = None
        self.started_with = None

    async def start_server(self, profile):
        self.started_with = profile
        if self.start_gate is not None:
            await self.start_gate.wait()
        return ("127.0.0.1", 8888)

    async def lease_holders(self, lease_id):
        self.asked += 1
        if isinstance(self.holders, Exception):
            raise self.holders
        return list(self.holders)


def _user(name: str, groups=()):
    return types.SimpleNamespace(name=name, groups=[types.SimpleNamespace(name=g) for g in groups],
                                 url=f"/user/{name}/", id=hash(name) % 1000, settings={}, server=None)


@pytest.fixture
def config(tmp_path):
    c = Config()
    c.GPULendingSpawner.inventory_kind = "simulated"
    c.SimulatedInventory.count = 2
    c.GPUPool.db_url = f"sqlite:///{tmp_path}/ledger.sqlite"
    c.GPULendingSpawner.lease_wait_timeout = 5.0
    yield c
    pool = lending._shared_pools.pop(id(c), None)
    if pool is not None:
        pool.close()


def make(config, name="alice", server="", groups=()):
    # A spawner's name is its database row's (orm_spawner), as in the hub.
    orm_spawner = types.SimpleNamespace(name=server, server=None, last_activity=None)
    return Lender(user=_user(name, groups), config=config, orm_spawner=orm_spawner)


async def user_stop(spawner):
    """JupyterHub 6's User.stop, in the order it calls the spawner."""
    spawner._stop_pending = True
    try:
        if await spawner.poll() is None:
            await spawner.stop()
    except Exception:
        pass  # the hub logs it and goes on to the post-stop hook
    finally:
        await spawner.run_post_stop_hook()
        spawner.clear_state()
        spawner._stop_pending = False


async def spawn(spawner, profile="tf-gpu-1"):
    await spawner._apply_profile({"profile": profile})
    return await spawner.start()


def history(spawner):
    return {lease.id: lease for lease in spawner.pool.history()}


def run(coro):
    return asyncio.run(coro)


@pytest.mark.parametrize("intent, age, reason", [
    (None, 0, EndReason.STOPPED),                      # the user, an admin in the hub, hub shutdown
    (("culled", "idle-culler"), 0, EndReason.CULLED),   # the culler recorded it before its DELETE
    (("admin", "carol"), 0, EndReason.ADMIN),           # the pool page's "end lease"
    (("culled", "idle-culler"), 600, EndReason.STOPPED),  # stale: a cull that never came
])
def test_a_stop_ends_the_lease_with_the_reason_its_asker_recorded(config, intent, age, reason):
    spawner = make(config)

    async def scenario():
        await spawn(spawner)
        lease_id = spawner.lease_id
        assert spawner.pool.lease(lease_id).active
        if intent is not None:
            assert spawner.pool.record_end_intent(lease_id, *intent)
            if age:  # recorded `age` seconds ago
                with spawner.pool._store.engine().begin() as conn:
                    at = conn.execute(sa.select(end_intents_table.c.at)).scalar_one()
                    conn.execute(sa.update(end_intents_table).values(at=at - timedelta(seconds=age)))
        await user_stop(spawner)
        return lease_id

    lease_id = run(scenario())
    ended = history(spawner)[lease_id]
    assert not ended.active and ended.end_reason == reason
    assert spawner.get_state().get("gpu_lease_id") is None


def test_an_intent_for_a_lease_that_ended_is_refused(config):
    spawner = make(config)
    lease = spawner.pool.try_acquire("bob", "", 1)
    spawner.pool.release(lease.id, EndReason.STOPPED)
    assert spawner.pool.record_end_intent(lease.id, EndReason.CULLED, "idle-culler") is False
    with pytest.raises(ValueError):
        spawner.pool.record_end_intent(lease.id, "whatever", "idle-culler")


def test_a_stop_that_raised_still_releases_once_the_engine_says_gone(config):
    spawner = make(config)

    async def scenario():
        await spawn(spawner)
        lease_id = spawner.lease_id
        # docker stop timed out, but the container went by itself meanwhile (holders: none).
        spawner.stop_raises = RuntimeError("docker stop timed out")
        await user_stop(spawner)
        return lease_id

    lease_id = run(scenario())
    assert history(spawner)[lease_id].end_reason == EndReason.STOPPED


def test_a_container_that_would_not_stop_keeps_its_gpu_lent_with_the_reason(config, monkeypatch):
    monkeypatch.setattr("spawner.lending.ending.SETTLE_GRACE_SECONDS", 0.0)
    spawner = make(config)

    async def scenario():
        await spawn(spawner)
        lease_id = spawner.lease_id
        spawner.stop_raises = RuntimeError("docker stop timed out")
        spawner.holders = ["jupyter-alice"]
        await user_stop(spawner)
        return lease_id

    lease_id = run(scenario())
    lease = spawner.pool.lease(lease_id)
    assert lease.active, "a GPU whose container may still run was freed"
    assert lease.problem == "jupyter-alice would not stop"


def test_a_container_that_stops_after_the_grace_frees_its_gpu_once_it_is_gone(config, monkeypatch):
    # A loaded Swarm node reports a task gone only after the stop's grace: the GPU is lent
    # again once it does, not at the reconciler's next pass minutes later.
    monkeypatch.setattr("spawner.lending.ending.SETTLE_GRACE_SECONDS", 0.0)
    monkeypatch.setattr("spawner.lending.ending.SETTLE_RECHECK_SECONDS", 0.01)
    spawner = make(config)

    async def scenario():
        await spawn(spawner)
        lease_id = spawner.lease_id
        spawner.holders = ["jupyter-alice"]
        await user_stop(spawner)
        assert spawner.pool.lease(lease_id).active, "freed while its container still ran"
        spawner.holders = ConnectionError("the node does not answer")
        unanswered = spawner.asked + 3
        await async_until(lambda: spawner.asked >= unanswered, what="three unanswered rechecks")
        assert spawner.pool.lease(lease_id).active, "freed on an unknown answer"
        spawner.holders = []  # the engine has removed it at last
        await async_until(lambda: not spawner.pool.lease(lease_id).active, what="the lease freed")
        return lease_id

    lease_id = run(scenario())
    assert history(spawner)[lease_id].end_reason == EndReason.STOPPED


def test_an_engine_that_cannot_answer_never_frees_the_gpu(config, monkeypatch):
    monkeypatch.setattr("spawner.lending.ending.SETTLE_GRACE_SECONDS", 0.0)
    spawner = make(config)

    async def scenario():
        await spawn(spawner)
        lease_id = spawner.lease_id
        spawner.holders = ConnectionError("dockerd does not answer")
        await user_stop(spawner)
        return lease_id

    lease_id = run(scenario())
    lease = spawner.pool.lease(lease_id)
    assert lease.active
    assert "could not be asked" in lease.problem and "dockerd does not answer" in lease.problem


def test_a_server_that_died_ends_its_lease_as_died(config):
    spawner = make(config)

    async def scenario():
        await spawn(spawner)
        lease_id = spawner.lease_id
        spawner.running = False  # crashed, OOM-killed, removed by hand
        assert await spawner.poll() == 1
        # JupyterHub's User.stop skips stop() for a server that already exited.
        await user_stop(spawner)
        return lease_id

    lease_id = run(scenario())
    assert history(spawner)[lease_id].end_reason == EndReason.DIED


def test_a_start_cancelled_after_the_lease_releases_it_as_failed_start(config):
    spawner = make(config)

    async def scenario():
        spawner.start_gate = asyncio.Event()  # the engine's start never finishes
        task = asyncio.create_task(spawn(spawner))
        await async_until(lambda: spawner.lease_id is not None and spawner.started_with is not None)
        lease_id = spawner.lease_id
        assert lease_id is not None and spawner.pool.lease(lease_id).active
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.gather(*spawner._background)  # the background settle the cancel started
        return lease_id

    lease_id = run(scenario())
    assert history(spawner)[lease_id].end_reason == EndReason.FAILED_START


def test_after_a_restart_only_the_own_server_adopts_a_lease(config):
    first = make(config, server="")

    async def scenario():
        await spawn(first)
        lease_id = first.lease_id
        # The hub restarts and its saved state lost the lease (killed mid-spawn).
        other_user, other_server, same = make(config, name="bob"), make(config, server="big"), make(config)
        assert not await other_user.adopt_lease(lease_id)
        assert not await other_server.adopt_lease(lease_id)
        assert await same.adopt_lease(lease_id)
        assert same.get_state()["gpu_lease_id"] == lease_id
        await user_stop(same)
        return lease_id

    lease_id = run(scenario())
    assert history(first)[lease_id].end_reason == EndReason.STOPPED


def test_a_spawn_queued_for_gpus_does_not_count_toward_the_start_limit(config):
    config.GPULendingSpawner.concurrent_start_limit = 1
    config.SimulatedInventory.count = 1
    holder, waiter, cpu, another = (make(config, name=n) for n in ("alice", "bob", "carol", "dave"))

    async def scenario():
        await spawn(holder)  # the only GPU is lent
        queued = asyncio.create_task(spawn(waiter))
        await async_until(holder.pool.queue, what="bob's spawn in the queue")
        # bob waits in the queue: carol's CPU server may start although the limit is 1.
        cpu.start_gate = asyncio.Event()
        starting = asyncio.create_task(spawn(cpu, "tf-cpu"))
        await async_until(lambda: cpu.started_with is not None, what="carol's start under way")
        # ...but a second start beyond the limit, while carol's runs, is refused.
        with pytest.raises(web.HTTPError) as refused:
            await spawn(another, "tf-cpu")
        assert refused.value.status_code == 429
        cpu.start_gate.set()
        await starting
        await user_stop(holder)
        await queued  # bob gets the GPU alice gave back
        assert waiter.lease_id is not None
        await user_stop(waiter)

    try:
        run(scenario())
    finally:
        admission._starting.clear()


def test_a_spawn_records_the_directorys_mail_for_notifications_and_follows_its_removal(config):
    from spawner.notify import directory

    spawner = make(config, "alice")
    run(spawner.run_auth_state_hook({"uid_number": 1000, "user_attributes": {"mail": ["alice@example.org"]}}))
    assert directory.read(spawner.pool, "alice") == (None, "alice@example.org")
    run(spawner.run_auth_state_hook({"uid_number": 1000, "user_attributes": {}}))  # the directory dropped it
    assert directory.read(spawner.pool, "alice") == (None, None)
    run(make(config, "bob").run_auth_state_hook(None))  # no directory attributes at all: nothing recorded
    assert directory.read(spawner.pool, "bob") == (None, None)
