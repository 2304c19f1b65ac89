"""The browser channel: the user's open GPU pool page shows their events as browser notifications.

Every event has a `browser` row in the outbox (outbox.channels_of).  A pool page whose user allowed
notifications asks `GET api/notifications/feed` every `BrowserNotifications.poll_interval`
seconds; the service then, for that user only:

- claims at most `page_size` of their due browser rows (two tabs asking at once get disjoint
  rows: the claim is under the ledger's write lock), so an event pops up in one tab, once;
- skips the events the user's choices do not want ("auto": every event, preferences.py);
- holds a `granted` event until the hub says its server is ready, as the mail does (ready.py),
  and gives a cull warning its signed "keep it" link;
- marks the rest `sent` before it answers: at most once (an answer lost on the way loses them).

Rows no page took within `max_age` expire (at each ask, and every EXPIRE_EVERY_S seconds in the
service: `expire`, a LedgerWatch's round), so a page opened tomorrow does not show yesterday's news.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

from ..pool.ledger import outbox
from ..pool.ledger.off_loop import ledger_call
from ..pool.ledger.outbox import Entry
from . import directory, preferences
from .message import Links, describe
from .sender import prepare
from .settings import BrowserNotifications, Notifications

CHANNEL = outbox.BROWSER
BODY_MAX = 300  # characters of a notification's text
EXPIRE_EVERY_S = 60.0
LEDGER_TIMEOUT = 15.0
_LINK_ROWS = ("Open it", "Keep it running")  # the notification itself is the link
log = logging.getLogger("gpu-pool-notify")


def as_notification(entry: Entry, links: Links) -> dict[str, Any]:
    """What the page shows: a title, a short text, the link a click opens."""
    title, rows, link = describe(entry, links)
    body = "\n".join(f"{label}: {value}" for label, value in rows if value and not label.startswith(_LINK_ROWS))
    return {"id": entry.id, "event": entry.event, "title": title[:BODY_MAX],
            "body": body if len(body) <= BODY_MAX else body[:BODY_MAX - 1] + "…", "url": link,
            "created_at": entry.created_at.isoformat()}


class BrowserFeed:
    """The feed's work for the service (`take`), and the round that expires what no page took."""

    def __init__(self, pool, settings: BrowserNotifications, events: Notifications | None = None,
                 owner: str | None = None):
        self.pool, self.settings = pool, settings
        self.events = events if events is not None else Notifications()
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:browser"

    async def _ledger(self, fn, *args):
        return await ledger_call(fn, *args, timeout=LEDGER_TIMEOUT)

    def _write(self, fn, *args):
        store = self.pool._store
        return store.write(lambda conn: fn(store, conn, *args))

    def expire(self, store) -> int:
        """One round of the expiry (a LedgerWatch's, every EXPIRE_EVERY_S): rows no page took in time."""
        return store.write(lambda conn: outbox.expire(store, conn, self.settings.max_age, CHANNEL))

    async def take(self, user: str, hub, key: bytes, origin: str, base_url: str, prefix: str) -> list[dict]:
        """`user`'s new notifications, marked delivered (`origin`: scheme://host the page was
        loaded from, so its links open on the same hub)."""
        s = self.settings

        def claim(store, conn):
            outbox.expire(store, conn, s.max_age, CHANNEL)
            return outbox.claim(store, conn, self.owner, CHANNEL, s.page_size, user=user)
        claimed: list[Entry] = await self._ledger(self._write, claim)
        if not claimed:
            return []
        raw, _ = await self._ledger(directory.read, self.pool, user)
        choices = preferences.stored(raw)
        wanted = [e for e in claimed
                  if preferences.wants(choices, e.event, CHANNEL, e.payload, self.events.ready_after)]
        unwanted = [e.id for e in claimed if e not in wanted]
        if unwanted:
            await self._ledger(self._write, outbox.finish, unwanted, outbox.SKIPPED, "not chosen by the user")
        if wanted:
            wanted = await prepare(self._ledger, self._write, hub, key, origin, prefix, user, wanted,
                                   s.poll_interval)
        if not wanted:
            return []
        ids = [e.id for e in wanted]
        await self._ledger(self._write, outbox.finish, ids, outbox.SENT, None, f"browser-{ids[0]}")
        links = Links(origin + base_url, origin + prefix, {})
        log.info("Showed %d notification(s) (%s) in %s's browser", len(wanted),
                 ", ".join(sorted({e.event for e in wanted})), user)
        return [as_notification(e, links) for e in wanted]
