"""Webhooks: Slack/Mattermost-compatible JSON to the URL a user set, on the admin's allow-list only.

- `checked_url`: a URL a user may set (https or http, no user:password part, no fragment, no
  control characters, at most `url_max` characters) that matches an entry of
  `WebhookNotifications.allowed_urls`, compared on the parsed URL (scheme, host, port, path), so
  `https://hooks.example.org.evil.test/` or `https://hooks.example.org@evil.test/` never pass.
  The sender checks it again at each delivery: an entry the admin removed stops its webhooks.
- `body_of` / `sign`: `{"text": ..., "username": "GPU hub"}` (what Slack's and Mattermost's
  incoming webhooks read), signed with the deployment's secret: `X-GPUHub-Signature-256:
  sha256=HMAC-SHA256(secret, "<X-GPUHub-Timestamp>." + body)`.
- `deliver`: one POST, no redirect followed (a redirect could lead off the allow-list), each step
  bounded by `timeout`; what became of it, as smtp.py tells a mail's fate.
- `WebhookSender`: the service's task for the outbox's `webhook` rows, on its own threads; at most
  once, with retries, the age bound and a per-user hourly limit (several events in one message).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import http.client
import json
import logging
import os
import re
import socket
import ssl
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from urllib.parse import urlsplit

from ..pool.ledger import outbox
from ..pool.ledger.off_loop import ledger_call
from ..pool.ledger.outbox import Entry
from ..services.hub_api import HubAPI
from ..services.lifecycle import cancel_and_wait
from . import directory, preferences
from .message import Links, describe
from .sender import prepare
from .settings import Notifications, WebhookNotifications
from .smtp import FAILED, RETRY, SENT, UNKNOWN, Outcome

CHANNEL = outbox.WEBHOOK
SIGNATURE_HEADER = "X-GPUHub-Signature-256"
TIMESTAMP_HEADER = "X-GPUHub-Timestamp"
CLAIM_BATCH = 200
DIGEST_MAX = 20  # events in one message
SEND_THREADS = 2
LEDGER_TIMEOUT = 15.0
RATE_WINDOW_S = 3600.0
ANSWER_MAX = 64 * 1024  # bytes of a receiver's answer read (and dropped)
_CONTROL = re.compile(r"[\x00-\x20\x7f]")
log = logging.getLogger("gpu-pool-notify")


class BadWebhook(ValueError):
    """A URL a user may not set (the message says why)."""


def _parts(url: str):
    u = urlsplit(url)
    port = u.port or (443 if u.scheme == "https" else 80)
    return u.scheme.lower(), (u.hostname or "").lower(), port, u.path or "/"


def checked_url(url: str, settings: WebhookNotifications) -> str:
    """`url` when a user may set it as their webhook; else BadWebhook naming the rule."""
    if not settings.enabled:
        raise BadWebhook("Webhooks are off on this hub (no WebhookNotifications.allowed_urls): ask your admin")
    if len(url) > settings.url_max:
        raise BadWebhook(f"The webhook URL is over {settings.url_max} characters")
    if _CONTROL.search(url):
        raise BadWebhook("The webhook URL holds spaces or control characters")
    try:
        u = urlsplit(url)
        scheme, host, port, path = _parts(url)
    except ValueError:
        raise BadWebhook("The webhook is not a URL (https://host/path)") from None
    if scheme not in ("https", "http") or not host:
        raise BadWebhook("The webhook must be an https:// (or http://) URL with a host")
    if u.username is not None or u.password is not None or "@" in u.netloc:
        raise BadWebhook("The webhook URL may not carry a user name or password")
    if u.fragment:
        raise BadWebhook("The webhook URL may not have a #fragment")
    for allowed in settings.allowed_urls:
        if "://" in allowed:
            a_scheme, a_host, a_port, a_path = _parts(allowed)
            if (scheme, host, port) == (a_scheme, a_host, a_port) and (
                    path == a_path or path.startswith(a_path if a_path.endswith("/") else a_path + "/")):
                return url
        elif scheme == "https" and host == allowed.strip().lower():
            return url
    raise BadWebhook(f"{url[:200]} is not on this hub's webhook allow-list (WebhookNotifications.allowed_urls: "
                     f"{', '.join(settings.allowed_urls)[:500]}); ask your admin to add your chat server")


def sign(secret: bytes, timestamp: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


def body_of(entries: list[Entry], links: Links) -> bytes:
    """One message telling `entries` (one user's), as Slack's and Mattermost's webhooks take it."""
    lines = []
    if len(entries) > 1:
        lines.append(f"{len(entries)} updates about your GPUs and jobs:")
    for e in entries:
        title, rows, link = describe(e, links)
        lines.append(f"*{title}*")
        lines += [f"{label}: {value}" for label, value in rows if value]
        if link:
            lines.append(link)
    events = sorted({e.event for e in entries})
    return json.dumps({"text": "\n".join(lines), "username": "GPU hub",
                       "gpuhub": {"events": [{"event": e.event, "payload": {k: v for k, v in e.payload.items()
                                                                             if k != "keep_url"}}
                                             for e in entries], "kinds": events}}).encode()


def deliver(url: str, body: bytes, secret: bytes, timeout: float, before_send: Callable[[], None] = lambda: None,
            context: ssl.SSLContext | None = None) -> Outcome:
    """POST `body` to `url` (blocking: call it off the loop)."""
    scheme, host, port, _ = _parts(url)
    u = urlsplit(url)
    target = (u.path or "/") + (f"?{u.query}" if u.query else "")
    stamp = str(int(time.time()))
    headers = {"Content-Type": "application/json", "User-Agent": "gpu-hub-notify", TIMESTAMP_HEADER: stamp,
               SIGNATURE_HEADER: sign(secret, stamp, body), "Content-Length": str(len(body))}
    conn: http.client.HTTPConnection
    if scheme == "https":
        conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=context or ssl.create_default_context())
    else:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
    where = f"{host}:{port}"
    try:
        try:
            conn.connect()
        except (OSError, ssl.SSLError) as e:
            return Outcome(RETRY, f"{where}: {type(e).__name__}: {e}"[:300])
        try:
            before_send()
        except Exception as e:
            return Outcome(RETRY, f"not sent: the outbox could not be updated ({type(e).__name__})")
        try:
            conn.request("POST", target, body=body, headers=headers)
            response = conn.getresponse()
            response.read(ANSWER_MAX)
        except (OSError, http.client.HTTPException) as e:
            return Outcome(UNKNOWN, f"{where}: the delivery may have arrived: {type(e).__name__}")
    finally:
        with contextlib.suppress(OSError):
            conn.close()
    code = response.status
    if 200 <= code < 300:
        return Outcome(SENT, "")
    if code >= 500 or code in (408, 429):
        return Outcome(RETRY, f"{where} answered {code}")
    return Outcome(FAILED, f"{where} answered {code} (a redirect is not followed)" if 300 <= code < 400
                   else f"{where} answered {code}")


class WebhookSender:
    """Delivers the outbox's `webhook` rows (like sender.Sender the e-mail ones)."""

    def __init__(self, pool, settings: WebhookNotifications, prefix: str, hub_url: str, hub=None,
                 events: Notifications | None = None, owner: str | None = None, deliver: Callable = deliver,
                 public_url: str = ""):
        self.pool, self.settings, self.prefix = pool, settings, prefix
        base = public_url.rstrip("/") or hub_url.rstrip("/")
        self.public_base, self.service_url = base, base + prefix
        self.events = events if events is not None else Notifications()
        self.hub = hub if hub is not None else HubAPI()
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:webhook"
        self._deliver = deliver
        self._executor = ThreadPoolExecutor(max_workers=SEND_THREADS, thread_name_prefix="gpu-webhook")
        self._task: asyncio.Task | None = None
        self._key: bytes | None = None

    def start(self) -> None:
        if not self.settings.enabled:
            return
        problems = self.settings.problems()
        if problems:
            log.error("Webhooks are allowed but cannot be sent: %s", "; ".join(problems))
            return
        self._task = asyncio.create_task(self._loop())
        log.info("Webhooks to %s", ", ".join(self.settings.allowed_urls))

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
            try:
                await self._ledger(self._write, outbox.give_back, self.owner)
            except Exception as exc:
                log.warning("Could not give back the claimed webhook deliveries (%s)", exc)
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _loop(self) -> None:
        while True:
            try:
                await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("Webhook pass failed; trying again in %s s", self.settings.poll_interval)
            await asyncio.sleep(self.settings.poll_interval)

    async def _ledger(self, fn, *args):
        return await ledger_call(fn, *args, timeout=LEDGER_TIMEOUT)

    def _write(self, fn, *args):
        store = self.pool._store
        return store.write(lambda conn: fn(store, conn, *args))

    def _read(self, fn, *args):
        store = self.pool._store
        return store.read(lambda conn: fn(store, conn, *args))

    async def run_once(self) -> int:
        """One look at the outbox; the number of deliveries made."""
        s = self.settings
        if self._key is None:
            self._key = await self._ledger(directory.secret, self.pool)

        def take(store, conn):
            outbox.expire(store, conn, s.max_age, CHANNEL)
            return outbox.claim(store, conn, self.owner, CHANNEL, CLAIM_BATCH)
        claimed: list[Entry] = await self._ledger(self._write, take)
        by_user: dict[str, list[Entry]] = defaultdict(list)
        for e in claimed:
            by_user[e.user].append(e)
        return sum(await asyncio.gather(*(self._for_user(u, es) for u, es in by_user.items())))

    async def _for_user(self, user: str, entries: list[Entry]) -> int:
        s = self.settings

        def look(store, conn):
            prefs, _ = directory.record(store, conn, user)
            since = store.now(conn) - timedelta(seconds=RATE_WINDOW_S)
            return prefs, outbox.sent_since(store, conn, user, CHANNEL, since)
        raw, recent = await self._ledger(self._read, look)
        choices, url = preferences.stored(raw), preferences.stored_webhook(raw)
        try:
            url = checked_url(url, s) if url else None
        except BadWebhook as exc:
            await self._ledger(self._write, outbox.finish, [e.id for e in entries], outbox.SKIPPED, str(exc))
            return 0
        wanted = [e for e in entries if url and preferences.wants(choices, e.event, CHANNEL, e.payload,
                                                                  self.events.ready_after)]
        unwanted = [e.id for e in entries if e not in wanted]
        if unwanted:
            await self._ledger(self._write, outbox.finish, unwanted, outbox.SKIPPED,
                               "not chosen by the user" if url else "no webhook set")
        if not wanted or url is None:
            return 0
        wanted = await prepare(self._ledger, self._write, self.hub, self._key or b"",
                               self.public_base, self.prefix, user, wanted, s.poll_interval)
        if not wanted:
            return 0
        if recent >= s.per_hour:
            await self._ledger(self._write, outbox.defer, [e.id for e in wanted], RATE_WINDOW_S / s.per_hour)
            return 0
        now, later = wanted[:DIGEST_MAX], wanted[DIGEST_MAX:]
        if later:
            await self._ledger(self._write, outbox.defer, [e.id for e in later], 0.0)
        return await self._send(user, url, now)

    async def _send(self, user: str, url: str, entries: list[Entry]) -> int:
        s = self.settings
        links = Links(self.public_base + "/", self.service_url, {})
        body = body_of(entries, links)
        ids = [e.id for e in entries]
        store = self.pool._store
        secret = s.secret()
        delivery_id = f"webhook-{ids[0]}-{int(time.time() * 1000)}"
        outcome = await asyncio.get_running_loop().run_in_executor(
            self._executor, lambda: self._deliver(url, body, secret, s.timeout,
                                                  lambda: store.write(lambda conn: outbox.begin(store, conn, ids))))
        what = f"{len(entries)} event(s) for {user}'s webhook"
        if outcome.result == SENT:
            await self._ledger(self._write, outbox.finish, ids, outbox.SENT, None, delivery_id)
            log.info("Delivered %s", what)
            return 1
        attempts = max(e.attempts for e in entries)
        if outcome.result == RETRY and attempts < s.max_attempts:
            delay = min(3600.0, s.retry_delay * 2 ** (attempts - 1))
            await self._ledger(self._write, outbox.retry, ids, delay, outcome.error)
            log.warning("Could not deliver %s (try %d of %d, next in %.0f s): %s", what, attempts, s.max_attempts,
                        delay, outcome.error)
            return 0
        state = outbox.UNKNOWN if outcome.result == UNKNOWN else outbox.FAILED
        await self._ledger(self._write, outbox.finish, ids, state, outcome.error)
        log.error("Gave up delivering %s (%s): %s", what, state, outcome.error)
        return 0
