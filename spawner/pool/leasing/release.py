"""Changing the ledger outside a grant: releasing, reconciling, draining GPUs.

Each function runs inside a write transaction the facade opens (store.write);
they end leases with a reason, which the ledger keeps for accounting.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from sqlalchemy import delete, insert, select, update

from ..history import queue_hours, rollup
from ..history.queries import load_leases
from ..ledger import statements as sql
from ..ledger.schema import audit_table, end_intents_table, gpus_table, lease_gpus_table, leases_table
from ..ledger.store import Store
from ..models import EndReason, InvalidRequest, Lease, UnknownGPU


def release(store: Store, conn, lease_id: int, reason: str) -> bool:
    """End one lease; False if it had already ended (or never existed)."""
    now = store.now(conn)
    done = store.run(conn, sql.END_LEASE, {"lid": lease_id, "now": now, "reason": reason})
    if done:
        store.run(conn, sql.END_LEASE_GPUS, {"lid": lease_id, "now": now})
        rollup.record_ended(store, conn, [lease_id])
    return bool(done)


def record_end_intent(store: Store, conn, lease_id: int, reason: str, actor: str) -> bool:
    """Note who is about to end an active lease's server, and why; False if it is not active."""
    active = conn.execute(select(leases_table.c.id).where(
        leases_table.c.id == lease_id, leases_table.c.ended_at.is_(None))).first()
    if active is None:
        return False
    conn.execute(delete(end_intents_table).where(end_intents_table.c.lease_id == lease_id))
    conn.execute(insert(end_intents_table).values(lease_id=lease_id, reason=reason, actor=actor,
                                                  at=store.now(conn)))
    return True


def end_intent(store: Store, conn, lease_id: int, max_age: float) -> tuple[str, str] | None:
    """(reason, actor) recorded for `lease_id` at most `max_age` seconds ago, else None."""
    row = conn.execute(select(end_intents_table.c.reason, end_intents_table.c.actor, end_intents_table.c.at)
                       .where(end_intents_table.c.lease_id == lease_id)).first()
    if row is None or (store.now(conn) - row.at).total_seconds() > max_age:
        return None
    return row.reason, row.actor


def remove_waiter(store: Store, conn, waiter_id: int) -> None:
    """Take a request out of the queue (it gave up or was cancelled); its record stays."""
    store.run(conn, sql.DELETE_WAITER, {"wid": waiter_id})
    queue_hours.close(store, conn, [{"wid": waiter_id, "now": store.now(conn), "outcome": "left"}])


def set_problem(conn, lease_id: int, problem: str) -> bool:
    """Note why an active lease stays lent after its server ended."""
    done = conn.execute(update(leases_table)
                        .where(leases_table.c.id == lease_id, leases_table.c.ended_at.is_(None))
                        .values(problem=problem))
    return bool(done.rowcount)


def undo_lease(conn, lease_id: int) -> None:
    """Erase a lease nobody ever saw (its acquire was cancelled)."""
    conn.execute(delete(lease_gpus_table).where(lease_gpus_table.c.lease_id == lease_id))
    conn.execute(delete(leases_table).where(leases_table.c.id == lease_id))


def end_leases(store: Store, conn, ids: list[int], reason: str, now: datetime) -> None:
    conn.execute(
        update(leases_table)
        .where(leases_table.c.id.in_(ids), leases_table.c.ended_at.is_(None))
        .values(ended_at=now, end_reason=reason)
    )
    conn.execute(
        update(lease_gpus_table)
        .where(lease_gpus_table.c.lease_id.in_(ids), lease_gpus_table.c.ended_at.is_(None))
        .values(ended_at=now)
    )
    rollup.record_ended(store, conn, ids)


def reconcile(store: Store, conn, host: str, live: set[int]) -> list[Lease]:
    """End the active leases of `host` not in `live`; returns them as ended."""
    now = store.now(conn)
    active = load_leases(conn, (leases_table.c.host == host) & leases_table.c.ended_at.is_(None))
    gone = [l for l in active if l.id not in live]
    if gone:
        end_leases(store, conn, [l.id for l in gone], EndReason.RECONCILED.value, now)
    return [replace(l, ended_at=now, end_reason=EndReason.RECONCILED.value) for l in gone]


def record(store: Store, conn, actor: str, action: str, detail: str | None,
           host: str | None = None, uuid: str | None = None) -> None:
    """An audit record: who did what, when."""
    conn.execute(insert(audit_table).values(at=store.now(conn), actor=actor, action=action,
                                            host=host, uuid=uuid, detail=detail))


def find_gpu(conn, uuid: str, host: str | None):
    """The ledger row of GPU `uuid` (on `host`, needed when several hosts list it)."""
    q = select(gpus_table).where(gpus_table.c.uuid == uuid)
    if host is not None:
        q = q.where(gpus_table.c.host == host)
    rows = conn.execute(q).all()
    if not rows:
        on = f" on host {host}" if host is not None else ""
        raise UnknownGPU(f"No GPU {uuid}{on} in the ledger; `gpu-pool status` lists the GPUs")
    if len(rows) > 1:
        hosts = ", ".join(sorted(r.host for r in rows))
        raise InvalidRequest(f"GPU {uuid} is listed on several hosts ({hosts}); name the host")
    return rows[0]


def set_drained(store: Store, conn, uuid: str, host: str | None, drained: bool,
                by: str | None = None) -> tuple[str, str]:
    """Drain or undrain one GPU; returns its (host, uuid).  `by`: who, for the audit."""
    row = find_gpu(conn, uuid, host)
    if by is not None:
        detail = None if bool(row.drained) != drained else f"already {'drained' if drained else 'lendable'}"
        record(store, conn, by, "drain" if drained else "undrain", detail, row.host, row.uuid)
    if bool(row.drained) != drained:
        conn.execute(
            update(gpus_table)
            .where(gpus_table.c.host == row.host, gpus_table.c.uuid == row.uuid)
            .values(drained=drained, drained_at=store.now(conn) if drained else None)
        )
    return row.host, row.uuid


def rehome(conn, old: str, new: str) -> dict[str, int]:
    """Move host `old`'s GPUs and active leases to the name `new` (a renamed host).

    GPUs already recorded under `new` keep that row (drained if either was);
    ended leases keep the name they ran under, for accounting.
    """
    g, l, lg = gpus_table, leases_table, lease_gpus_table
    old_rows = conn.execute(select(g).where(g.c.host == old)).all()
    if not old_rows:
        raise UnknownGPU(f"No GPUs under host '{old}' in the ledger; `gpu-pool status` lists the hosts")
    new_rows = {r.uuid: r for r in conn.execute(select(g).where(g.c.host == new))}
    active_new = {r.uuid for r in conn.execute(select(lg.c.uuid).where(lg.c.host == new, lg.c.ended_at.is_(None)))}
    active_old = {r.uuid for r in conn.execute(select(lg.c.uuid).where(lg.c.host == old, lg.c.ended_at.is_(None)))}
    both = sorted(active_old & active_new)
    if both:
        raise InvalidRequest(
            f"GPU {both[0]} has an active lease under both '{old}' and '{new}'; stop one of those servers first"
        )
    for r in old_rows:
        if r.uuid in new_rows:
            if r.drained and not new_rows[r.uuid].drained:
                conn.execute(update(g).where(g.c.host == new, g.c.uuid == r.uuid).values(
                    drained=True, drained_at=r.drained_at))
            conn.execute(delete(g).where(g.c.host == old, g.c.uuid == r.uuid))
        else:
            conn.execute(update(g).where(g.c.host == old, g.c.uuid == r.uuid).values(host=new))
    moved = conn.execute(update(l).where(l.c.host == old, l.c.ended_at.is_(None)).values(host=new)).rowcount
    conn.execute(update(lg).where(lg.c.host == old, lg.c.ended_at.is_(None)).values(host=new))
    return {"gpus": len(old_rows), "leases": moved}
