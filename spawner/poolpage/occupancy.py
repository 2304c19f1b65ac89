"""Pool occupancy and queue length over time, from the ledger's intervals: pure functions.

A period is cut into equal buckets; each bucket holds the time-weighted mean
over it (1.5 lent = one GPU lent all along and another half the time), so a
short lease is never lost between two samples.
"""

from __future__ import annotations

import csv
import io
from datetime import datetime, timedelta

from ..pool.history.timeline import Interval, Timeline

PERIODS = {"24h": timedelta(hours=24), "7d": timedelta(days=7), "30d": timedelta(days=30)}
DEFAULT_PERIOD = "7d"
DEFAULT_BUCKETS = 96
MAX_BUCKETS = 1000
# Buckets this long or longer are drawn from the hourly rollup (see pool/history/timeline.py).
HOURLY_FROM = timedelta(hours=1)


def accumulate(spans, since: datetime, step: float, n: int) -> list[float]:
    """Mean count per bucket of `spans` ((interval, weight) pairs) over n buckets of `step` s."""
    total = [0.0] * n
    for (start, end), weight in spans:
        a = (start - since).total_seconds()
        b = (end - since).total_seconds()
        first, last = max(0, int(a // step)), min(n - 1, int(b // step))
        for i in range(first, last + 1):
            lo, hi = max(a, i * step), min(b, (i + 1) * step)
            if hi > lo:
                total[i] += (hi - lo) * weight
    return [t / step for t in total]


def subtract(spans: list[Interval], cuts: list[Interval]) -> list[Interval]:
    """The parts of `spans` outside every interval of `cuts`."""
    out = []
    for start, end in spans:
        pieces = [(start, end)]
        for c0, c1 in cuts:
            nxt = []
            for p0, p1 in pieces:
                if c1 <= p0 or c0 >= p1:
                    nxt.append((p0, p1))
                    continue
                if p0 < c0:
                    nxt.append((p0, c0))
                if c1 < p1:
                    nxt.append((c1, p1))
            pieces = nxt
        out.extend(pieces)
    return out


def series(tl: Timeline, buckets: int = DEFAULT_BUCKETS) -> dict:
    """{"times": bucket starts, "step_s", "gpus", "lent", "drained", "free", "queue", "queue_gpus"}.

    drained counts drained GPUs that are not lent (a lent GPU's drain waits
    for its lease to end); free is what is left of the pool's present size.
    """
    n = max(1, min(int(buckets), MAX_BUCKETS))
    step = max((tl.until - tl.since).total_seconds() / n, 1e-6)
    lent = accumulate(((s, 1) for spans in tl.lent.values() for s in spans), tl.since, step, n)
    if tl.hours:
        # An hour's GPU-seconds (from the rollup), as a mean GPU count over its part of the period.
        by_hour = accumulate(((span, seconds / max((span[1] - span[0]).total_seconds(), 1e-9))
                              for span, seconds in tl.hours), tl.since, step, n)
        lent = [a + b for a, b in zip(lent, by_hour)]
    lent_of = tl.drained_lent if tl.drained_lent is not None else tl.lent
    idle_drained = [(s, 1) for key, spans in tl.drained.items() for s in subtract(spans, lent_of.get(key, []))]
    drained = accumulate(idle_drained, tl.since, step, n)
    queue = accumulate(((span, 1) for span, _ in tl.queue), tl.since, step, n)
    queue_gpus = accumulate(((span, count) for span, count in tl.queue), tl.since, step, n)
    if tl.queue_hours:
        # An hour's request-seconds and GPU-seconds asked (from the rollup), as means over its part.
        def spread(i: int) -> list[float]:
            return accumulate(((span, row[i] / max((span[1] - span[0]).total_seconds(), 1e-9))
                               for span, *row in tl.queue_hours), tl.since, step, n)
        queue = [a + b for a, b in zip(queue, spread(0))]
        queue_gpus = [a + b for a, b in zip(queue_gpus, spread(1))]
    free = [max(0.0, tl.gpus - a - b) for a, b in zip(lent, drained)]
    r = lambda xs: [round(x, 3) for x in xs]  # noqa: E731
    return {
        "times": [(tl.since + timedelta(seconds=i * step)).isoformat() for i in range(n)],
        "step_s": round(step, 3), "gpus": tl.gpus,
        "lent": r(lent), "drained": r(drained), "free": r(free), "queue": r(queue), "queue_gpus": r(queue_gpus),
    }


def series_csv(data: dict) -> str:
    """The series as CSV: one row per bucket (its start, mean lent/drained/free GPUs, mean waiting requests)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["bucket_start", "lent", "drained", "free", "queue", "queue_gpus"])
    for i, t in enumerate(data["times"]):
        writer.writerow([t] + [f"{data[k][i]:.3f}" for k in ("lent", "drained", "free", "queue", "queue_gpus")])
    return out.getvalue()
