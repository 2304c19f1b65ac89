"""The sender: a task of the gpu-pool service that takes due events from the ledger's outbox and
mails them.

Each pass (every `poll_interval` seconds) settles what a stopped sender left (outbox.release_stuck),
drops events past `max_age`, claims the due ones and groups them per user.  A user's events that
their choices (preferences.py) do not want, or who has no address, are `skipped`; a user who had
`mails_per_hour` mails in the last hour has theirs wait, so that they go later as one digest.
Mails go out on the sender's own threads (never the service's loop, nor the ledger's threads),
each SMTP step bounded by `timeout`: a dead SMTP server delays only the mails.  A `granted` event
waits until its server is ready (ready.py); a cull warning gets its signed "keep it" link.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from email.utils import parseaddr

from ..pool.ledger import outbox
from ..pool.ledger.off_loop import ledger_call
from ..pool.ledger.outbox import Entry
from ..services.hub_api import HubAPI
from ..services.lifecycle import cancel_and_wait
from . import cull_warning, directory, preferences, ready, signing, smtp
from .message import Links, compose
from .settings import EmailNotifications, Notifications

CHANNEL = outbox.EMAIL
CLAIM_BATCH = 200  # rows claimed per pass
DIGEST_MAX = 50  # events in one mail; more wait for the next pass
SEND_THREADS = 2
LEDGER_TIMEOUT = 15.0
RATE_WINDOW_S = 3600.0
HUB_DOWN_RETRY_S = 5.0  # a ready check the hub did not answer is tried again this much later
log = logging.getLogger("gpu-pool-notify")


async def prepare(ledger, write, hub, key: bytes, public_base: str, prefix: str,
                  user: str, entries: list[Entry], poll_interval: float) -> list[Entry]:
    """The entries to tell now, with their links: `granted` ones whose server is ready (the
    others wait, or are skipped when the server is gone), cull warnings with their "keep it" link."""
    looked = await ready.look(hub, user, entries, public_base)
    waiting = [i for i, (v, _) in looked.items() if v == ready.WAITING]
    unknown = [i for i, (v, _) in looked.items() if v == ready.UNKNOWN]
    gone = [i for i, (v, _) in looked.items() if v == ready.GONE]
    if waiting:
        await ledger(write, outbox.defer, waiting, poll_interval)
    if unknown:
        await ledger(write, outbox.defer, unknown, HUB_DOWN_RETRY_S)
    if gone:
        await ledger(write, outbox.finish, gone, outbox.SKIPPED, "the server stopped before it was ready")
    out = []
    for e in entries:
        verdict, e = looked.get(e.id, (ready.READY, e))
        if verdict == ready.READY:
            out.append(cull_warning.with_links(e, key, public_base, prefix))
    return out


class Sender:
    def __init__(self, pool, settings: EmailNotifications, prefix: str, hub_url: str,
                 send: Callable = smtp.send, owner: str | None = None, hub=None,
                 events: Notifications | None = None):
        """`prefix`: the service's path (/services/gpu-pool/); `hub_url`: the hub's public URL with
        its base path, when `settings.public_url` is empty; `hub`: the hub's REST API (hubapi.HubAPI)."""
        self.pool = pool
        self.settings = settings
        self.events = events if events is not None else Notifications()
        self.hub = hub if hub is not None else HubAPI()
        self.prefix = prefix
        base = settings.public_url.rstrip("/") or hub_url.rstrip("/")
        self.hub_url = base + "/"
        self.service_url = base + prefix
        self.public_base = base
        self._send = send
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}"
        self._executor = ThreadPoolExecutor(max_workers=SEND_THREADS, thread_name_prefix="gpu-notify")
        self._task: asyncio.Task | None = None
        self._key: bytes | None = None
        self._wake = asyncio.Event()

    # --- running -------------------------------------------------------------------

    def start(self) -> None:
        problems = self.settings.problems()
        if problems:
            log.error("Notification e-mail is enabled but cannot be sent: %s", "; ".join(problems))
            return
        if self.settings.enabled:
            self._task = asyncio.create_task(self._loop())
            log.info("Notification e-mail through %s:%s (%s)", self.settings.smtp_host, self.settings.smtp_port,
                     self.settings.security)

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
            try:  # what it claimed and never began to send goes to the next sender at once
                await self._ledger(self._write, outbox.give_back, self.owner)
            except Exception as exc:
                log.warning("Could not give back the claimed notifications (%s); they are settled after "
                            "EmailNotifications.stuck_after", exc)
        self._executor.shutdown(wait=False, cancel_futures=True)

    def poke(self) -> None:
        """Look at the outbox now (an event was just written in this process)."""
        self._wake.set()

    async def _loop(self) -> None:
        while True:
            try:
                await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("Notification pass failed; trying again in %s s", self.settings.poll_interval)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.poll_interval):  # wait_for could lose a stop (off_loop.py)
                    await self._wake.wait()
            self._wake.clear()

    async def _ledger(self, fn, *args):
        return await ledger_call(fn, *args, timeout=LEDGER_TIMEOUT)

    def _write(self, fn, *args):
        store = self.pool._store
        return store.write(lambda conn: fn(store, conn, *args))

    def _read(self, fn, *args):
        store = self.pool._store
        return store.read(lambda conn: fn(store, conn, *args))

    # --- one pass ----------------------------------------------------------------------

    async def run_once(self) -> int:
        """One look at the outbox; the number of mails sent."""
        s = self.settings
        if self._key is None:
            self._key = await self._ledger(directory.secret, self.pool)

        def take(store, conn):
            outbox.release_stuck(store, conn, s.stuck_after)
            outbox.expire(store, conn, s.max_age, CHANNEL)
            return outbox.claim(store, conn, self.owner, CHANNEL, CLAIM_BATCH)
        claimed: list[Entry] = await self._ledger(self._write, take)
        if not claimed:
            return 0
        by_user: dict[str, list[Entry]] = defaultdict(list)
        for e in claimed:
            by_user[e.user].append(e)
        results = await asyncio.gather(*(self._for_user(user, entries) for user, entries in by_user.items()))
        return sum(results)

    async def _for_user(self, user: str, entries: list[Entry]) -> int:
        s = self.settings

        def look(store, conn):
            prefs, address = directory.record(store, conn, user)
            since = store.now(conn) - timedelta(seconds=RATE_WINDOW_S)
            return prefs, address, outbox.sent_since(store, conn, user, CHANNEL, since)
        raw, address, recent = await self._ledger(self._read, look)
        choices = preferences.stored(raw)
        wanted = [e for e in entries
                  if preferences.wants(choices, e.event, e.channel, e.payload, self.events.ready_after)]
        unwanted = [e.id for e in entries if e not in wanted]
        if unwanted:
            await self._ledger(self._write, outbox.finish, unwanted, outbox.SKIPPED, "not chosen by the user")
        if not wanted:
            return 0
        ids = [e.id for e in wanted]
        if not address:
            await self._ledger(self._write, outbox.finish, ids, outbox.SKIPPED,
                               "no address: the directory gave none (its mail attribute)")
            return 0
        wanted = await prepare(self._ledger, self._write, self.hub, self._key or b"", self.public_base,
                               self.prefix, user, wanted, s.poll_interval)
        if not wanted:
            return 0
        ids = [e.id for e in wanted]
        if recent >= s.mails_per_hour:
            # Over the rate: they wait (not counted as tries) and go later together, as a digest.
            await self._ledger(self._write, outbox.defer, ids, RATE_WINDOW_S / s.mails_per_hour)
            return 0
        now_mail, later = wanted[:DIGEST_MAX], wanted[DIGEST_MAX:]
        if later:
            await self._ledger(self._write, outbox.defer, [e.id for e in later], 0.0)
        return await self._mail(user, address, now_mail)

    async def _mail(self, user: str, address: str, entries: list[Entry]) -> int:
        s = self.settings
        key = self._key or b""
        events = sorted({e.event for e in entries})
        links = Links(self.hub_url, self.service_url,
                      {ev: signing.unsubscribe_url(key, self.public_base, self.prefix, user, ev) for ev in events})
        domain = parseaddr(s.from_address)[1].rpartition("@")[2] or "gpu-hub.invalid"
        msg = compose(entries, address, s.from_address, links, domain=domain)
        ids = [e.id for e in entries]
        store = self.pool._store
        loop = asyncio.get_running_loop()
        outcome = await loop.run_in_executor(
            self._executor,
            lambda: self._send(msg, s, lambda: store.write(lambda conn: outbox.begin(store, conn, ids))))
        what = f"{len(entries)} event(s) ({', '.join(events)}) for {user}"
        if outcome.result == smtp.SENT:
            await self._ledger(self._write, outbox.finish, ids, outbox.SENT, None, msg["Message-ID"])
            log.info("Mailed %s", what)
            return 1
        attempts = max(e.attempts for e in entries)
        if outcome.result == smtp.RETRY and attempts < s.max_attempts:
            delay = min(3600.0, s.retry_delay * 2 ** (attempts - 1))
            await self._ledger(self._write, outbox.retry, ids, delay, outcome.error)
            log.warning("Could not mail %s (try %d of %d, next in %.0f s): %s", what, attempts, s.max_attempts,
                        delay, outcome.error)
            return 0
        state = outbox.UNKNOWN if outcome.result == smtp.UNKNOWN else outbox.FAILED
        await self._ledger(self._write, outbox.finish, ids, state, outcome.error)
        log.error("Gave up mailing %s (%s): %s", what, state, outcome.error)
        return 0
