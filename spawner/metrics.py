"""Pool metrics on the hub's own /hub/metrics endpoint.

JupyterHub serves prometheus_client's default registry, so registering here is
all it takes.  The GPU gauges come from the ledger (one small query), so they
are right even when another hub or the CLI changed it; the query runs off the
hub's event loop (a scrape must never wait on the database), so a scrape
shows the counts read at the previous scrape or lease change, at most
`STALE_AFTER` seconds old, and no sample when the ledger stopped answering.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

LEASE_WAIT_SECONDS = Histogram(
    "gpuhub_lease_wait_seconds",
    "Time a spawn waited for its GPU lease (0 for CPU profiles is not recorded).",
    buckets=(0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600),
)

# Counted so an admin (and a test) can see the reconciler is alive, and how often it fails.
RECONCILE_PASSES = Counter(
    "gpuhub_reconcile_passes",
    "Reconcile passes of the GPU ledger against the engine, by outcome (ok, or failed: retried).",
    ["outcome"],
)


STALE_AFTER = 60.0


class PoolCollector:
    """Reports gpuhub_gpus{state} and gpuhub_lease_queue_length from pool.counts()."""

    def __init__(self, counts: Callable[[], dict]):
        self._counts = counts
        self._latest: dict | None = None
        self._read_at = 0.0
        self._refreshing: asyncio.Task | None = None

    def refresh_soon(self) -> None:
        """Read the counts again, off the event loop (at once, outside the hub)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            with contextlib.suppress(Exception):
                self._store(self._counts())
            return
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = loop.create_task(self._refresh())

    async def _refresh(self) -> None:
        from .pool.ledger.off_loop import ledger_call

        # An unreachable ledger: the samples go stale and then disappear.
        with contextlib.suppress(Exception):
            self._store(await ledger_call(self._counts, timeout=10.0))

    def _store(self, counts: dict) -> None:
        self._latest, self._read_at = counts, time.monotonic()

    def describe(self):
        # Lets the registry learn the names without a ledger read at registration.
        yield GaugeMetricFamily("gpuhub_gpus", "GPUs in the pool by state.", labels=["state"])
        yield GaugeMetricFamily("gpuhub_lease_queue_length", "Spawns waiting for GPUs.")

    def collect(self):
        counts = self._latest if time.monotonic() - self._read_at < STALE_AFTER else None
        self.refresh_soon()
        if counts is None:
            return
        gpus = GaugeMetricFamily("gpuhub_gpus", "GPUs in the pool by state.", labels=["state"])
        for state in ("free", "lent", "drained"):
            gpus.add_metric([state], counts.get(state, 0))
        yield gpus
        yield GaugeMetricFamily("gpuhub_lease_queue_length", "Spawns waiting for GPUs.",
                                value=counts.get("queued", 0))


_registered: PoolCollector | None = None


def register_pool(counts: Callable[[], dict]) -> None:
    """Register the pool's gauges once per process."""
    global _registered
    if _registered is None:
        _registered = PoolCollector(counts)
        REGISTRY.register(_registered)


def pool_changed() -> None:
    """A lease began or ended in this process: refresh the gauges soon."""
    if _registered is not None:
        _registered.refresh_soon()
