"""Reading the ledger, as methods of the GPUPool facade (a mixin): leases, history, usage,
every GPU's state, the queue, the timeline.

SQL in queries.py, rollup.py and timeline.py; the facade supplies the store and its options.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import ColumnElement

from .. import validation
from ..leasing import grant, serving_order
from ..leasing.policy import WaiterRow
from ..ledger.part import PoolPart
from ..ledger.schema import leases_table
from ..models import GPUStatus, Lease, Waiter
from . import queries, rollup, timeline

if TYPE_CHECKING:
    pass


class PoolQueries(PoolPart):
    """GPUPool's reads (see the module docstring)."""

    # Supplied by the GPUPool facade besides PoolPart's (declared for the type checker only).
    waiter_stale_after: float
    queue_order: str
    _use_cache: dict | None
    shares: Callable[[], serving_order.Shares]

    def lease(self, lease_id: int) -> Lease | None:
        """The lease with this id (active or ended), or None."""
        lease_id = validation.lease_id(lease_id)
        if not validation.storable_id(lease_id):
            return None
        found = self._read(lambda conn: queries.load_leases(conn, leases_table.c.id == lease_id))
        return found[0] if found else None

    def leases(self, user: str | None = None, host: str | None = None) -> list[Lease]:
        """Active leases, oldest first, optionally of one user or host."""
        where: ColumnElement[bool] = leases_table.c.ended_at.is_(None)
        if user is not None:
            where &= leases_table.c.user_name == validation.name(user, "The user name")
        if host is not None:
            where &= leases_table.c.host == validation.name(host, "The host name")
        return self._read(lambda conn: queries.load_leases(conn, where))

    def history(
        self, user: str | None = None, since: datetime | None = None, until: datetime | None = None
    ) -> list[Lease]:
        """Leases (ended or active) that overlap [since, until), by start time."""
        since, until = validation.aware(since, "since"), validation.aware(until, "until")
        user = validation.name(user, "The user name") if user is not None else None
        where = queries.history_where(user, since, until)
        order = (leases_table.c.started_at, leases_table.c.id)
        return self._read(lambda conn: queries.load_leases(conn, where, order=order))

    def usage(self, since: datetime | None = None, until: datetime | None = None) -> dict:
        """GPU-hours inside [since, until): {"users": {user: h}, "groups": {group: h}}.

        Active leases count up to now.  A lease counts fully for each group
        its user was in when it started.
        """
        since, until = validation.aware(since, "since"), validation.aware(until, "until")
        # From the rolled-up hours (rollup.py): its cost follows the period, not the history.
        return self._read(lambda conn: rollup.usage(self._store, conn, since, until, self._store.now(conn)))

    def gpus(self) -> list[GPUStatus]:
        """Every GPU in the ledger with its drain flag and holding lease, by host and index."""
        return self._read(queries.gpus)

    def counts(self) -> dict[str, int]:
        """{"free", "lent", "drained", "queued"} for metrics.

        free: lendable now; lent: in an active lease (drained or not);
        drained: drained and not lent; queued: live waiters.
        """
        queued = self._read(lambda conn: queries.queued_count(conn, self._store.now(conn), self.waiter_stale_after))
        return queries.counts(self.gpus(), queued)

    def queue(self) -> list[Waiter]:
        """Live waiters, in the order they are served (queue_order), each with why it is there."""
        def read(conn):
            now = self._store.now(conn)
            waiters = queries.queue(conn, now, self.waiter_stale_after)
            rows = [WaiterRow(w.id, w.user, w.count, None, w.since, now, workers=w.workers, groups=w.groups)
                    for w in waiters]
            o = grant.ordered(self._store, conn, rows, now, self.queue_order, self.shares(), self._use_cache)
            by_id = {w.id: w for w in waiters}
            return [replace(by_id[r.id], position=i + 1,
                            why=grant.explain(o, i, self.queue_order, self.shares(), now)
                            if self.queue_order == serving_order.FAIRSHARE else serving_order.fifo_why(i + 1))
                    for i, r in enumerate(o.rows)]
        return self._read(read)

    def timeline(self, since: datetime, until: datetime | None = None, hourly: bool = False) -> timeline.Timeline:
        """When each GPU was lent or drained, and requests waited, inside [since, until) (until: now).

        hourly: the ended leases' lent GPUs as GPU-seconds per hour from the rollup (for charts
        whose steps are an hour or longer: the cost follows the hours, not the leases)."""
        since, until = validation.aware(since, "since"), validation.aware(until, "until")

        def read(conn):
            now = self._store.now(conn)
            return timeline.timeline(conn, since, min(until or now, now), now, self.waiter_stale_after, hourly)
        return self._read(read)

    def recent_leases(self, user: str, limit: int = 50) -> list[Lease]:
        """`user`'s newest `limit` leases (active or ended), newest first."""
        user = validation.name(user, "The user name")
        return self._read(lambda conn: queries.recent_leases(conn, user, max(1, int(limit))))

    def lease_lengths(self, limit: int = 500) -> list[float]:
        """Seconds the newest `limit` ended leases lasted, newest first (for wait estimates)."""
        return self._read(lambda conn: timeline.lease_lengths(conn, max(1, int(limit))))
