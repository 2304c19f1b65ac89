"""Notification choices (`GET/PUT api/notifications`), the mails' one-click unsubscribe links
(`notifications/unsubscribe`) and the cull warnings' "keep it" links (`notifications/keep`), for
spawner/notify/.

Each user reads and sets only their own choices.  A PUT is checked whole before anything is
stored (a 400 naming what is wrong changes nothing), is at most DOCUMENT_MAX bytes (413), and a
user may make at most PUTS_PER_MINUTE of them (429).  An unsubscribe link needs no login: its
signature (signing.py) names one user and one event; a GET shows a button, the POST (the page's,
or a mail client's RFC 8058 one-click) sets that event's mails to "never".  A webhook URL in a
PUT must be on the admin's allow-list (notify/webhook.py), else a 400 says so.  A keep link needs
no login either: its signature names one user's one server and its expiry; a GET shows a button,
the POST counts as that server's activity through the hub's API, unless the server is no longer
running or has reached its profile's maximum age (409, saying which).  The feed
(`api/notifications/feed`) is what an open pool page asks for the user's new browser
notifications (notify/browser.py): their own only, at most `BrowserNotifications.page_size` an
answer and `polls_per_minute` asks a minute (429 with Retry-After).
"""

from __future__ import annotations

import html
import time
from collections import defaultdict, deque
from datetime import UTC, datetime, timedelta

from jupyterhub.utils import url_path_join
from tornado import web

from ...culling.deadline import deadline
from ...notify import directory, own_address, preferences, signing, webhook
from ...notify.settings import BrowserNotifications, Notifications, WebhookNotifications
from ...pool.ledger.events import EVENTS
from ...pool.ledger.outbox import EMAIL
from ...pool.ledger.schema import NAME_MAX
from ...services.hub_api import HubUnavailable
from .actions import hub_api
from .base import LEDGER_TIMEOUT, APIHandler, Unframed, ledger_call, log
from .wait import settings_of

PUTS_PER_MINUTE = 20
KEEPS_PER_MINUTE = 6  # a keep link's POSTs per user (each one is a call to the hub's API)
_recent_puts: dict[str, deque] = defaultdict(deque)
_recent_keeps: dict[str, deque] = defaultdict(deque)
_recent_polls: dict[str, deque] = defaultdict(deque)


def _limit(user: str, recent: dict[str, deque] = _recent_puts, most: int = PUTS_PER_MINUTE,
           what: str = "changes of your notification choices") -> None:
    now = time.monotonic()
    seen = recent[user]
    while seen and seen[0] < now - 60:
        seen.popleft()
    if len(seen) >= most:
        raise web.HTTPError(429, f"At most {most} {what} a minute; try again in a minute")
    seen.append(now)
    if len(recent) > 10000:  # bounded: forget the quiet users
        for name in [n for n, q in recent.items() if not q or q[-1] < now - 60]:
            del recent[name]


class NotificationsAPI(APIHandler):
    async def document(self, user: str) -> dict:
        raw, listed = await self.call(directory.read_stored, self.pool, user)
        own = own_address.view(raw, listed, time.time())
        address = own.pop("address")
        mail = self.settings.get("notify")
        hooks = self.settings.get("webhooks") or WebhookNotifications()
        told = self.settings.get("notify_events") or Notifications()
        feed = self.settings.get("browser_feed")
        browser = feed.settings if feed is not None else BrowserNotifications(enabled=False)
        return {"events": preferences.stored(raw), "address": address, "own_address": own,
                "webhook": preferences.stored_webhook(raw),
                "channels": {"email": {"enabled": bool(mail is not None and mail.enabled)},
                             "webhook": {"enabled": hooks.enabled, "allowed": list(hooks.allowed_urls)},
                             "browser": {"enabled": browser.enabled, "poll_interval_s": browser.poll_interval}},
                "auto_after_s": preferences.AUTO_AFTER_S, "ready_after_s": told.ready_after}

    async def get(self):
        viewer = self.require_viewer()
        self.write_json(await self.document(viewer.name))

    async def put(self):
        viewer = self.require_viewer()
        _limit(viewer.name)
        if len(self.request.body) > preferences.DOCUMENT_MAX:
            raise web.HTTPError(413, f"The document is over {preferences.DOCUMENT_MAX} bytes")
        try:
            choices, url = preferences.parse_document(self.request.body)
            if url is not preferences.KEEP and url is not None:
                url = webhook.checked_url(url, self.settings.get("webhooks") or WebhookNotifications())
        except (preferences.BadPreferences, webhook.BadWebhook) as exc:
            raise web.HTTPError(400, str(exc)) from None
        name, pool = viewer.name, self.pool

        def store():
            if url is preferences.KEEP:
                raw, _ = directory.read(pool, name)
                kept = preferences.stored_webhook(raw)
            else:
                kept = url
            directory.set_preferences(pool, name, preferences.dump(choices, kept))
        await self.call(store)
        log.info("%s set their notification choices", viewer.name)
        self.write_json(await self.document(viewer.name))


class FeedAPI(APIHandler):
    """The caller's new browser notifications, each given once (notify/browser.py)."""

    def write_error(self, status_code: int, **kwargs) -> None:
        if status_code == 429:
            self.set_header("Retry-After", "60")
        super().write_error(status_code, **kwargs)

    async def get(self):
        viewer = self.require_viewer()
        feed = self.settings.get("browser_feed")
        if feed is None or not feed.settings.enabled:
            raise web.HTTPError(404, "Browser notifications are off on this hub (BrowserNotifications.enabled)")
        _limit(viewer.name, _recent_polls, feed.settings.polls_per_minute, "asks for new notifications")
        key = await ledger_call(self.settings["notify_key"], timeout=LEDGER_TIMEOUT)
        origin = f"{self.request.protocol}://{self.request.host}"
        shown = await feed.take(viewer.name, hub_api(self), key, origin, self.settings["base_url"],
                                self.settings["prefix"])
        self.set_header("Cache-Control", "no-store")
        self.write_json({"events": shown, "poll_after_s": feed.settings.poll_interval})


PAGE = """<!DOCTYPE html><html><head><meta charset="utf-8"><title>GPU hub mails</title></head>
<body><h1>GPU hub mails</h1>{body}</body></html>"""


class Unsubscribe(Unframed, web.RequestHandler):
    """No login: the link's signature is the authority (one user, one event)."""

    async def _checked(self) -> tuple[str, str]:
        if len(self.request.body) > 4096 or len(self.request.query) > 4096:
            raise web.HTTPError(413)
        user, event = self.get_argument("user", ""), self.get_argument("event", "")
        given = self.get_argument("token", "")
        if not user or len(user) > NAME_MAX or event not in EVENTS:
            raise web.HTTPError(400)
        key = await ledger_call(self.settings["notify_key"], timeout=LEDGER_TIMEOUT)
        if not signing.valid(key, user, event, given):
            raise web.HTTPError(403)
        return user, event

    def write_error(self, status_code: int, **kwargs) -> None:
        says = {400: "This link is not a whole unsubscribe link: copy it from the mail again.",
                403: "This link's signature does not match: copy it from the mail again, or change "
                     "your choices on the GPU pool page.",
                413: "This request is too large."}.get(status_code, "Something went wrong; try again.")
        self.finish(PAGE.format(body=f"<p>{html.escape(says)}</p>"))

    async def get(self):
        user, event = await self._checked()
        fields = "".join(f'<input type="hidden" name="{k}" value="{html.escape(self.get_argument(k), quote=True)}">'
                         for k in ("user", "event", "token"))
        self.finish(PAGE.format(body=(
            f"<p>Stop the mails about <b>{html.escape(event)}</b> for <b>{html.escape(user)}</b>?</p>"
            f'<form method="post">{fields}<button type="submit">Unsubscribe</button></form>')))

    async def post(self):
        user, event = await self._checked()
        pool = self.settings["pool"]

        def unsubscribe():  # the mails only: a webhook the user set stays as they chose
            raw, _ = directory.read(pool, user)
            choices = preferences.stored(raw)
            choices[event][EMAIL] = preferences.NEVER
            directory.set_preferences(pool, user, preferences.dump(choices, preferences.stored_webhook(raw)))
        await ledger_call(unsubscribe, timeout=LEDGER_TIMEOUT)
        log.info("%s unsubscribed from %s mails by their link", user, event)
        self.finish(PAGE.format(body=f"<p>Done: no more mails about <b>{html.escape(event)}</b>. "
                                     "Change it back with <code>PUT api/notifications</code>.</p>"))


def _at(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


class Keep(Unframed, web.RequestHandler):
    """A cull warning's "keep it": no login, the link's signature names the user, the server and
    the expiry.  Counting as activity is bounded: never past the profile's maximum age."""

    def _checked(self):
        if len(self.request.body) > 4096 or len(self.request.query) > 4096:
            raise web.HTTPError(413, "This request is too large.")
        user, server = self.get_argument("user", ""), self.get_argument("server", "")
        try:
            expires = int(self.get_argument("expires", ""))
        except ValueError:
            expires = -1
        if not user or len(user) > NAME_MAX or len(server) > NAME_MAX or expires < 0:
            raise web.HTTPError(400, "This link is not a whole keep-it link: copy it from the mail again.")
        key = self.settings["notify_key"]
        return user, server, expires, key

    async def _valid(self) -> tuple[str, str]:
        user, server, expires, key_of = self._checked()
        key = await ledger_call(key_of, timeout=LEDGER_TIMEOUT)
        if not signing.keep_valid(key, user, server, expires, self.get_argument("token", "")):
            raise web.HTTPError(403, "This link does not keep this server: it is signed for its owner's one "
                                     "server only, and was changed or is for another user's server.")
        if time.time() > expires:
            raise web.HTTPError(410, f"This link expired at {_at(datetime.fromtimestamp(expires, UTC))}, when "
                                     "the server was due to be culled. Open the hub to start it again, or use "
                                     "the link in a newer mail.")
        return user, server

    def write_error(self, status_code: int, **kwargs) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        says = exc.log_message if isinstance(exc, web.HTTPError) and exc.log_message else \
            "Something went wrong; try again in a minute."
        if self.get_status() == 429:
            self.set_header("Retry-After", "60")
        self.finish(PAGE.format(body=f"<p>{html.escape(says)}</p>"))

    async def get(self):
        user, server = await self._valid()
        fields = "".join(f'<input type="hidden" name="{k}" value="{html.escape(self.get_argument(k), quote=True)}">'
                         for k in ("user", "server", "expires", "token"))
        self.finish(PAGE.format(body=(
            f"<p>Keep <b>{html.escape(user)}</b>'s server <b>{html.escape(server or '(default)')}</b> running? "
            "This counts as activity now, as if you had used it.</p>"
            f'<form method="post">{fields}<button type="submit">Keep it running</button></form>')))

    async def post(self):
        user, server = await self._valid()
        _limit(user, _recent_keeps, KEEPS_PER_MINUTE, "uses of a keep-it link")
        hub = hub_api(self)
        try:
            srv = next((s for s in await hub.servers_of_user(user) if s.name == server), None)
        except HubUnavailable:
            raise web.HTTPError(503, "The hub did not answer; try the link again in a minute.") from None
        label = f"Your server {server or '(default)'}"
        if srv is None or not srv.ready:
            raise web.HTTPError(409, f"{label} is not running (it may have been culled already): start it "
                                     "again from the hub's home page.")
        rules = settings_of(self).cull_rules
        now = datetime.now(UTC)
        max_age = rules.profile_max_age.get(srv.profile or "", 0.0) if rules is not None else 0.0
        if max_age > 0 and srv.started is not None and srv.started + timedelta(seconds=max_age) <= now:
            raise web.HTTPError(409, f"{label} has reached its maximum age (profile {srv.profile}, "
                                     f"{max_age / 3600:g} h) and cannot be kept: it stops at the culler's next "
                                     "round. Save your work now.")
        try:
            await hub.record_activity(user, server, now)
        except HubUnavailable:
            raise web.HTTPError(503, "The hub did not answer; try the link again in a minute.") from None
        log.info("%s kept their server %r by a cull warning's link", user, server)
        said = f"<p>Kept: {html.escape(label)} counts as active now.</p>"
        if rules is not None:
            d = deadline(rules, last_activity=now, started=srv.started, is_gpu=srv.lease_id is not None,
                         profile=srv.profile or None, contended=False)
            if d.at is not None:
                said += f"<p>If it stays idle it is culled at {html.escape(_at(d.at))} ({html.escape(d.reason)}).</p>"
        self.finish(PAGE.format(body=said))


def routes(prefix: str) -> list[tuple]:
    return [(url_path_join(prefix, "api", "notifications"), NotificationsAPI),
            (url_path_join(prefix, "api", "notifications", "feed"), FeedAPI),
            (url_path_join(prefix, signing.UNSUBSCRIBE_PATH), Unsubscribe),
            (url_path_join(prefix, signing.KEEP_PATH), Keep)]
