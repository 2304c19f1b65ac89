"""Cull warnings: the gpu-pool service's watch over the servers' idle-cull deadlines.

Every `Notifications.cull_check_every` seconds the watch lists the hub's active servers (their
last activity, profile and lease, as the culler reads them) and computes each one's deadline by
the culler's own rule (culling/deadline.py, with the queue's contention from the ledger).  A
server whose deadline is `cull_warning_before` or less away gets one `cull-warning` event in the
outbox per idle spell (the spell is named by the last activity it began at: any activity starts
a new one).  The senders give each warning its signed "keep it" link (`with_links`); following
it counts as activity through the hub's API (poolpage/handlers/keep.py).  A server that reaches
its profile's maximum age is warned too, without the link: keeping it is not possible.

What the watch cannot foresee: the culler's GPU-utilisation rule (a server whose GPUs stay idle
is culled whatever its activity says) is not warned about.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from urllib.parse import urlsplit

from ..culling.deadline import CullRules, contended, deadline
from ..pool.ledger import events
from ..pool.ledger.events import CULL_WARNING
from ..pool.ledger.off_loop import ledger_call
from ..pool.ledger.outbox import Entry
from ..services.hub_api import HubUnavailable
from ..services.lifecycle import cancel_and_wait
from . import signing
from .settings import Notifications

log = logging.getLogger("gpu-pool-notify")
LEDGER_TIMEOUT = 15.0


def with_links(entry: Entry, key: bytes, public_base: str, prefix: str) -> Entry:
    """A cull warning with its links: the server's, and (not at its maximum age) "keep it",
    signed for its owner and server and valid until the deadline it warns of."""
    if entry.event != CULL_WARNING:
        return entry
    p = entry.payload
    origin = "{0.scheme}://{0.netloc}".format(urlsplit(public_base))
    extra = {"server_url": origin + str(p.get("server_path") or "/")}
    if not p.get("by_max_age"):
        expires = int(datetime.fromisoformat(str(p["deadline"])).timestamp())
        extra["keep_url"] = signing.keep_url(key, public_base, prefix, entry.user, p.get("server_name") or "",
                                             expires)
    return entry._replace(payload={**p, **extra})


def due(rules: CullRules, servers, waiting_hosts, now: datetime, before: float) -> list[tuple]:
    """(server, its Deadline) for the ready servers culled within `before` seconds if they stay idle."""
    out = []
    for srv in servers:
        if not srv.ready:
            continue
        d = deadline(rules, last_activity=srv.last_activity, started=srv.started, is_gpu=srv.lease_id is not None,
                     profile=srv.profile or None, contended=contended(srv.host, waiting_hosts))
        if d.at is not None and 0 < (d.at - now).total_seconds() <= before:
            out.append((srv, d))
    return out


class CullWatch:
    """The service's task that queues cull warnings (nothing when the hub does not cull)."""

    def __init__(self, pool, hub, rules: CullRules | None, settings: Notifications):
        self.pool, self.hub, self.rules, self.settings = pool, hub, rules, settings
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self.rules is not None and self.settings.cull_warning_before > 0:
            self._task = asyncio.create_task(self._loop())
            log.info("Cull warnings %.0f s before an idle server's cull", self.settings.cull_warning_before)

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None

    async def _loop(self) -> None:
        while True:
            try:
                await self.run_once()
            except asyncio.CancelledError:
                raise
            except HubUnavailable as exc:
                log.warning("No cull warnings this round: %s", exc)
            except Exception:
                log.exception("The cull warnings' round failed; trying again in %s s", self.settings.cull_check_every)
            await asyncio.sleep(self.settings.cull_check_every)

    async def run_once(self, now: datetime | None = None) -> int:
        """One look at the deadlines; the number of warnings queued."""
        assert self.rules is not None
        servers = await self.hub.active_servers()
        if not servers:
            return 0
        waiting = [w.hosts for w in await ledger_call(self.pool.queue, timeout=LEDGER_TIMEOUT)]
        now = now or datetime.now(UTC)
        queued = 0
        store = self.pool._store
        for srv, d in due(self.rules, servers, waiting, now, self.settings.cull_warning_before):
            spell = (srv.last_activity or srv.started or now).isoformat()
            payload = {"deadline": d.at.isoformat(), "reason": d.reason, "by_max_age": d.by_max_age,
                       "server_path": srv.url, "last_activity": srv.last_activity.isoformat()
                       if srv.last_activity else None}
            if await ledger_call(store.write, lambda conn, srv=srv, spell=spell, payload=payload: events.cull_warning(
                    store, conn, srv.user, srv.name, spell, payload), timeout=LEDGER_TIMEOUT):
                queued += 1
                log.info("Warned %s: their server %r is culled at %s if it stays idle (%s)", srv.user, srv.name,
                         d.at.isoformat(timespec="seconds"), d.reason)
        return queued
