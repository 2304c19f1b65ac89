"""Notification choices (`GET/PUT api/notifications`) and the mails' one-click unsubscribe links
(`notifications/unsubscribe`), for spawner/notify/.

Each user reads and sets only their own choices.  A PUT is checked whole before anything is
stored (a 400 naming what is wrong changes nothing), is at most DOCUMENT_MAX bytes (413), and a
user may make at most PUTS_PER_MINUTE of them (429).  An unsubscribe link needs no login: its
signature (signing.py) names one user and one event; a GET shows a button, the POST (the page's,
or a mail client's RFC 8058 one-click) sets that event to "never".
"""

from __future__ import annotations

import html
import json
import time
from collections import defaultdict, deque

from jupyterhub.utils import url_path_join
from tornado import web

from ...notify import directory, preferences, signing
from ...pool.ledger.events import EVENTS
from ...pool.ledger.outbox import CHANNELS
from ...pool.ledger.schema import NAME_MAX
from .base import LEDGER_TIMEOUT, APIHandler, Unframed, ledger_call, log

PUTS_PER_MINUTE = 20
_recent_puts: dict[str, deque] = defaultdict(deque)


def _limit(user: str) -> None:
    now = time.monotonic()
    seen = _recent_puts[user]
    while seen and seen[0] < now - 60:
        seen.popleft()
    if len(seen) >= PUTS_PER_MINUTE:
        raise web.HTTPError(429, f"At most {PUTS_PER_MINUTE} changes of your notification choices a minute; "
                                 "try again in a minute")
    seen.append(now)
    if len(_recent_puts) > 10000:  # bounded: forget the quiet users
        for name in [n for n, q in _recent_puts.items() if not q or q[-1] < now - 60]:
            del _recent_puts[name]


class NotificationsAPI(APIHandler):
    async def document(self, user: str) -> dict:
        raw, address = await self.call(directory.read, self.pool, user)
        mail = self.settings.get("notify")
        return {"events": preferences.stored(raw), "address": address,
                "channels": {"email": {"enabled": bool(mail is not None and mail.enabled)}},
                "auto_after_s": preferences.AUTO_AFTER_S}

    async def get(self):
        viewer = self.require_viewer()
        self.write_json(await self.document(viewer.name))

    async def put(self):
        viewer = self.require_viewer()
        _limit(viewer.name)
        if len(self.request.body) > preferences.DOCUMENT_MAX:
            raise web.HTTPError(413, f"The document is over {preferences.DOCUMENT_MAX} bytes")
        try:
            choices = preferences.parse(self.request.body)
        except preferences.BadPreferences as exc:
            raise web.HTTPError(400, str(exc)) from None
        await self.call(directory.set_preferences, self.pool, viewer.name, json.dumps(choices, sort_keys=True))
        log.info("%s set their notification choices", viewer.name)
        self.write_json(await self.document(viewer.name))


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

        def unsubscribe():
            raw, _ = directory.read(pool, user)
            choices = preferences.stored(raw)
            for channel in CHANNELS:
                choices[event][channel] = preferences.NEVER
            directory.set_preferences(pool, user, json.dumps(choices, sort_keys=True))
        await ledger_call(unsubscribe, timeout=LEDGER_TIMEOUT)
        log.info("%s unsubscribed from %s mails by their link", user, event)
        self.finish(PAGE.format(body=f"<p>Done: no more mails about <b>{html.escape(event)}</b>. "
                                     "Change it back with <code>PUT api/notifications</code>.</p>"))


def routes(prefix: str) -> list[tuple]:
    return [(url_path_join(prefix, "api", "notifications"), NotificationsAPI),
            (url_path_join(prefix, signing.UNSUBSCRIBE_PATH), Unsubscribe)]
