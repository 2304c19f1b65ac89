"""Bookings told outside the tab: the gpu-pool service's watch over the live bookings.

Every `Notifications.cull_check_every` seconds the watch reads the live bookings
(pool/fair_use/bookings.py) and the active leases on their GPUs, and writes, once each
(events.once):

- `booking` "soon" to the booker when their booking starts within SOON_S (15 minutes);
- `booking` "ready" to the booker once it has started and none of its GPUs is held by anyone
  it is not for (the servers and jobs there were stopped, reason `booking`);
- `booked-out` to the holder of a lease on a GPU booked for someone else: their server or job is
  stopped when the booking starts (how long is left), once per lease and booking.
"""

from __future__ import annotations

import json
from datetime import timedelta

from sqlalchemy import select

from ..pool.fair_use import bookings
from ..pool.ledger import events
from ..pool.ledger.schema import lease_gpus_table, leases_table
from ..pool.ledger.store import as_utc

SOON_S = 15 * 60.0


def _holders(conn, b: bookings.Booking) -> list[tuple[int, str, list[str], str, str]]:
    """(lease id, user, groups, server name, started) of the active leases on `b`'s GPUs."""
    l, lg = leases_table.c, lease_gpus_table.c
    rows = conn.execute(select(l.id, l.user_name, l.groups, l.server_name, l.started_at).distinct()
                        .select_from(leases_table.join(lease_gpus_table, lg.lease_id == l.id))
                        .where(l.ended_at.is_(None), lg.host == b.host, lg.uuid.in_(b.gpu_uuids))).all()
    return [(r.id, r.user_name, json.loads(r.groups), r.server_name, as_utc(r.started_at).isoformat())
            for r in rows]


def news(store, conn) -> list[tuple[str, str, dict, dict]]:
    """(user, event, key, payload) of what the live bookings may have to tell now."""
    now = store.now(conn)
    out: list[tuple[str, str, dict, dict]] = []
    for b in bookings.live(conn, now):
        about = {"host": b.host, "gpus": len(b.gpu_uuids), "group": b.group,
                 "starts_at": b.starts_at.isoformat(), "ends_at": b.ends_at.isoformat()}
        others = [h for h in _holders(conn, b) if not b.for_(h[1], h[2])]
        if now < b.starts_at <= now + timedelta(seconds=SOON_S):
            out.append((b.user, events.BOOKING, {"booking_id": b.id, "kind": "soon"}, about))
        if b.active(now) and not others:
            out.append((b.user, events.BOOKING, {"booking_id": b.id, "kind": "ready"}, about))
        if now < b.starts_at:
            out += [(user, events.BOOKED_OUT, {"booking_id": b.id, "lease_id": lease_id},
                     {**about, "server_name": server, "stops_at": b.starts_at.isoformat()})
                    for lease_id, user, _, server, _ in others]
    return out


def run_once(store) -> int:
    """One look (a read, leaving out what was told already; a write only when news is left); the
    number of events queued, each once (events.once checks again under the write lock)
    (blocking: call it on the ledger's threads)."""
    found = store.read(lambda conn: [(user, event, key, payload) for user, event, key, payload in news(store, conn)
                                      if not events.told(conn, user, event, key)])
    if not found:
        return 0
    return store.write(lambda conn: sum(events.once(store, conn, user, event, key, payload)
                                        for user, event, key, payload in found))
