"""The notification outbox in the ledger: events written with the fact they tell, taken by one sender.

`enqueue` runs inside the transaction that records the fact (a queued server's grant in
leasing/grant.py, a job's end in job_records.py), so an event exists exactly when its fact does.
A sender (spawner/notify/) `claim`s due rows under the write lock (state `claimed`, its name in
`claimed_by`), marks them `sending` (`begin`) just before the message may reach the server, then
records the outcome: `sent`; `retry` (back to pending after a backoff, while attempts and age
allow); `failed` or `expired` (given up); `skipped` (the user chose not to get it); `unknown`
(the mail server may have taken the message: never sent again, so at most once).  Rows of a
sender that stopped half-way are settled by `release_stuck`: `claimed` ones go back to pending
(nothing of them was sent), `sending` ones become `unknown`.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy import func, insert, select, update

from .schema import notify_users_table, outbox_table

EMAIL, WEBHOOK, BROWSER = "email", "webhook", "browser"
# Each event gets one row per channel: an e-mail row always (the sender skips a user without an
# address), a webhook row only for a user who set a webhook URL (spawner/notify/preferences.py),
# a browser row always (the user's open pool page takes it from its feed, notify/browser.py, or it
# expires after BrowserNotifications.max_age).
CHANNELS = (EMAIL, WEBHOOK, BROWSER)
PENDING, CLAIMED, SENDING, SENT = "pending", "claimed", "sending", "sent"
FAILED, EXPIRED, SKIPPED, UNKNOWN = "failed", "expired", "skipped", "unknown"
DONE_STATES = (SENT, FAILED, EXPIRED, SKIPPED, UNKNOWN)
PAYLOAD_MAX = 16_000  # characters of one event's JSON (a job's command is cut to fit)


class Entry(NamedTuple):
    id: int
    user: str
    event: str
    channel: str
    payload: dict[str, Any]
    created_at: datetime
    attempts: int


def channels_of(conn, user: str) -> tuple[str, ...]:
    """The channels an event of `user` is written for (their stored choices name a webhook or not)."""
    raw = conn.execute(select(notify_users_table.c.preferences).where(notify_users_table.c.user_name == user)).scalar()
    try:
        doc = json.loads(raw) if raw else {}
    except ValueError:
        doc = {}
    hook = isinstance(doc, dict) and bool(doc.get("webhook"))
    return tuple(c for c in CHANNELS if c != WEBHOOK or hook)


def enqueue(store, conn, user: str, event: str, payload: dict[str, Any]) -> list[int]:
    """One pending row per channel of the user's for `event`, due now, in the caller's transaction."""
    now = store.now(conn)
    body = json.dumps(payload, sort_keys=True)
    if len(body) > PAYLOAD_MAX:
        payload = {**payload, "command": str(payload.get("command", ""))[:1000] + " …"}
        body = json.dumps(payload, sort_keys=True)[:PAYLOAD_MAX]
    return [conn.execute(insert(outbox_table).values(
        user_name=user, event=event, channel=channel, payload=body, created_at=now, state=PENDING,
        attempts=0, next_at=now)).inserted_primary_key[0] for channel in channels_of(conn, user)]


def claim(store, conn, owner: str, channel: str, limit: int, user: str | None = None) -> list[Entry]:
    """Take up to `limit` due pending rows of `channel` (of `user` only, when given) for `owner`
    (oldest first)."""
    now = store.now(conn)
    t = outbox_table.c
    stmt = (select(t.id, t.user_name, t.event, t.channel, t.payload, t.created_at, t.attempts)
            .where(t.state == PENDING, t.channel == channel, t.next_at <= now))
    if user is not None:
        stmt = stmt.where(t.user_name == user)
    rows = conn.execute(stmt.order_by(t.id).limit(limit)).all()
    if not rows:
        return []
    conn.execute(update(outbox_table).where(t.id.in_([r.id for r in rows]), t.state == PENDING)
                 .values(state=CLAIMED, claimed_by=owner, attempts=t.attempts + 1, next_at=now))  # next_at: claimed at
    return [Entry(r.id, r.user_name, r.event, r.channel, json.loads(r.payload), r.created_at, r.attempts + 1)
            for r in rows]


def defer(store, conn, ids: list[int], delay_s: float) -> None:
    """Claimed rows that wait (a rate limit): pending again after `delay_s`, the claim not counted as a try."""
    if ids:
        t = outbox_table.c
        conn.execute(update(outbox_table).where(t.id.in_(ids), t.state == CLAIMED)
                     .values(state=PENDING, claimed_by=None, attempts=t.attempts - 1,
                             next_at=store.now(conn) + timedelta(seconds=delay_s)))


def begin(store, conn, ids: list[int]) -> None:
    """These claimed rows' message may reach the server from now on."""
    if ids:
        t = outbox_table.c
        conn.execute(update(outbox_table).where(t.id.in_(ids), t.state == CLAIMED).values(state=SENDING))


def finish(store, conn, ids: list[int], state: str, error: str | None = None, mail_id: str | None = None) -> None:
    """Record the outcome of claimed rows (a DONE_STATES state; `mail_id`: the message they went in)."""
    if ids:
        t = outbox_table.c
        conn.execute(update(outbox_table).where(t.id.in_(ids), t.state.in_((CLAIMED, SENDING)))
                     .values(state=state, done_at=store.now(conn), error=error[:500] if error else None,
                             mail_id=mail_id))


def retry(store, conn, ids: list[int], delay_s: float, error: str) -> None:
    """Nothing of these rows reached the server: back to pending, not tried before `delay_s`."""
    if ids:
        t = outbox_table.c
        conn.execute(update(outbox_table).where(t.id.in_(ids), t.state.in_((CLAIMED, SENDING)))
                     .values(state=PENDING, claimed_by=None, error=error[:500],
                             next_at=store.now(conn) + timedelta(seconds=delay_s)))


def give_back(store, conn, owner: str) -> int:
    """A stopping sender's rows it claimed but never began to send: pending again, due now."""
    t = outbox_table.c
    return conn.execute(update(outbox_table).where(t.state == CLAIMED, t.claimed_by == owner)
                        .values(state=PENDING, claimed_by=None, next_at=store.now(conn),
                                attempts=t.attempts - 1)).rowcount


def release_stuck(store, conn, older_than_s: float) -> tuple[int, int]:
    """Rows claimed longer ago than `older_than_s` by a sender that never finished them (it
    crashed): `claimed` ones pending again, due now; `sending` ones `unknown` (the server may
    have taken them; at most once means never again).  (rows given back, rows settled unknown)"""
    t = outbox_table.c
    now = store.now(conn)
    before = now - timedelta(seconds=older_than_s)  # a claimed row's next_at is when it was claimed
    back = conn.execute(update(outbox_table).where(t.state == CLAIMED, t.next_at < before)
                        .values(state=PENDING, claimed_by=None, next_at=now)).rowcount
    lost = conn.execute(update(outbox_table).where(t.state == SENDING, t.next_at < before)
                        .values(state=UNKNOWN, done_at=now, error="its sender stopped while sending")).rowcount
    return back, lost


def expire(store, conn, max_age_s: float, channel: str = EMAIL) -> int:
    """Pending rows of `channel` older than `max_age_s`: `expired` (news too old to tell)."""
    t = outbox_table.c
    now = store.now(conn)
    return conn.execute(update(outbox_table).where(t.state == PENDING, t.channel == channel,
                                                   t.created_at < now - timedelta(seconds=max_age_s))
                        .values(state=EXPIRED, done_at=now, error="older than the outbox's age bound")).rowcount


def sent_since(store, conn, user: str, channel: str, since: datetime) -> int:
    """How many mails (a digest counts once) of `channel` `user` was sent since `since`."""
    t = outbox_table.c
    return conn.execute(select(func.count(t.mail_id.distinct())).select_from(outbox_table).where(
        t.user_name == user, t.channel == channel, t.state == SENT, t.done_at >= since)).scalar_one()


def entries(conn, user: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
    """The newest rows (operators, tests), newest first."""
    t = outbox_table.c
    stmt = select(outbox_table).order_by(t.id.desc()).limit(limit)
    if user is not None:
        stmt = stmt.where(t.user_name == user)
    return [dict(r._mapping, payload=json.loads(r.payload)) for r in conn.execute(stmt).all()]
