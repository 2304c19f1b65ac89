"""Pool metrics on the hub's own /hub/metrics endpoint.

JupyterHub serves prometheus_client's default registry, so registering here is
all it takes.  The GPU gauges are read from the ledger at scrape time (one
small query), so they are right even when another hub or the CLI changed it.
"""

from __future__ import annotations

from typing import Callable

from prometheus_client import REGISTRY, Histogram
from prometheus_client.core import GaugeMetricFamily

LEASE_WAIT_SECONDS = Histogram(
    "gpuhub_lease_wait_seconds",
    "Time a spawn waited for its GPU lease (0 for CPU profiles is not recorded).",
    buckets=(0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600),
)


class PoolCollector:
    """Reports gpuhub_gpus{state} and gpuhub_lease_queue_length from pool.counts()."""

    def __init__(self, counts: Callable[[], dict]):
        self._counts = counts

    def collect(self):
        try:
            counts = self._counts()
        except Exception:
            # A scrape must never fail the hub; an unreachable ledger shows as no sample.
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
