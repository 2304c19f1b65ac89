"""The ledger on a real PostgreSQL when things go wrong: clocks that disagree, a server that stops answering."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import pytest
from sqlalchemy.engine import make_url

from spawner.inventory import SimulatedInventory
from spawner.pool import GPUPool, PoolUnavailable
from tests.unit.test_pool_failures import slow_clock_keeps_its_place

# How long a call to a silent ledger may take here, loosely: the options
# below allow about call_timeout + connect_timeout; minutes would be the bug.
BOUND_S = 30


def test_postgres_a_hub_whose_clock_is_behind_keeps_its_place_in_the_queue(postgres_database):
    slow_clock_keeps_its_place(postgres_database)


def through(proxy_port: int, url: str) -> str:
    return make_url(url).set(host="127.0.0.1", port=proxy_port).render_as_string(hide_password=False)


def bounded(call, seconds: float = BOUND_S):
    """Run `call` in a thread; its result or exception, or a test failure if it is still running."""
    pool = ThreadPoolExecutor(1)
    started = time.monotonic()
    future = pool.submit(call)
    try:
        return future.exception(timeout=seconds) or future.result(), time.monotonic() - started
    except FutureTimeout:
        pytest.fail(f"a ledger call to a silent server still hangs after {seconds} s")
    finally:
        pool.shutdown(wait=False)


def test_postgres_that_stops_answering_fails_calls_quickly(postgres_server, postgres_database, blackhole_proxy):
    proxy = blackhole_proxy(postgres_server.port)
    url = through(proxy.port, postgres_database)
    pool = GPUPool(
        inventory=SimulatedInventory(count=2, host="node-1"), db_url=url,
        call_timeout=3, connect_timeout=2, lock_timeout=1, statement_timeout=2, poll_interval=0.1,
    )
    lease = pool.try_acquire("alice", "", 1)
    assert lease is not None  # the proxy forwards
    proxy.blackhole()

    for name, call in [
        ("try_acquire", lambda: pool.try_acquire("bob", "", 1)),
        ("release", lambda: pool.release(lease.id)),
        ("counts", pool.counts),
        ("acquire", lambda: asyncio.run(pool.acquire("carol", "", 1, timeout=2))),
    ]:
        error, took = bounded(call)
        assert isinstance(error, PoolUnavailable), f"{name}: {error!r}"
        assert error.status_code == 503
        assert make_url(postgres_database).password not in str(error)
        print(f"{name}: {took:.1f} s: {error}")

    # A fresh pool finds the silent server at connect time, also within the bound.
    fresh = GPUPool(db_url=url, connect_timeout=2, call_timeout=3)
    error, _ = bounded(fresh.leases)
    assert isinstance(error, PoolUnavailable) and "unavailable" in str(error)
