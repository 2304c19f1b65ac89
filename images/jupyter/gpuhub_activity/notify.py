"""What the in-lab notifications (labextension/src/notify.ts) read: GET gpuhub/notifications.

The user's new browser notifications (issue 39: "your GPU is ready", "your job ended", "your
server is culled in 10 minutes", ...) come from the hub's gpu-pool service's feed
(`api/notifications/feed`, spawner/notify/browser.py), which gives each event once.  The browser
never talks to the hub: this server asks the feed with its own token ($JUPYTERHUB_API_TOKEN, whose
scopes include access to that service) and answers only the logged-in owner of this server.

Bounds: the feed's (at most `BrowserNotifications.page_size` events an answer, `polls_per_minute`
asks a minute per user: a 429 is passed on with its Retry-After), and here one ask at a time per
server (`ASK_EVERY` apart at least, however many tabs ask; a tab that asks too soon gets an empty
answer, never another tab's events twice).  The in-lab side polls from one tab per browser only
(a Web Lock, shared with the pool page's own poller).
"""

from __future__ import annotations

import json
import os
import time

from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

REQUEST_TIMEOUT = 10.0
# The feed is asked at most this often by this server, whatever its tabs do.
ASK_EVERY = 1.0
# The slowest the in-lab poller goes when the feed is unwell or off (seconds).
BACKOFF_S = 60.0


def _join(*pieces: str) -> str:
    joined = "/".join(p.strip("/") for p in pieces if p.strip("/"))
    return ("/" + joined) if pieces and pieces[0].startswith("/") else joined


class LabFeed:
    """Asks the pool service's feed for this server's owner."""

    def __init__(self, log, env: dict[str, str] | None = None):
        env = os.environ if env is None else env
        self.log = log
        self.pool_url = env.get("GPUHUB_POOL_URL") or env.get("GPUHUB_JOBS_URL", "")
        self.token = env.get("JUPYTERHUB_API_TOKEN", "")
        self._asked = 0.0
        self._asking = False

    async def take(self) -> tuple[int, dict]:
        """(status, answer): the answer is {"events": [...], "poll_after_s": N} on 200."""
        if not (self.pool_url and self.token):
            return 404, {"message": "Notifications: this server was not started by the hub's GPU pool",
                         "poll_after_s": BACKOFF_S}
        now = time.monotonic()
        if self._asking or now - self._asked < ASK_EVERY:
            return 200, {"events": [], "poll_after_s": ASK_EVERY * 5}
        self._asking, self._asked = True, now
        url = _join(self.pool_url, "api", "notifications", "feed")
        try:
            response = await AsyncHTTPClient().fetch(HTTPRequest(
                url, headers={"Authorization": f"token {self.token}", "Accept": "application/json"},
                request_timeout=REQUEST_TIMEOUT, connect_timeout=REQUEST_TIMEOUT), raise_error=False)
        except (OSError, HTTPClientError) as exc:
            self.log.warning("gpuhub: the pool service's notification feed did not answer: %s", exc)
            return 502, {"message": "Notifications: the pool service did not answer", "poll_after_s": BACKOFF_S}
        finally:
            self._asking = False
        try:
            answer = json.loads(response.body or b"{}")
        except ValueError:
            answer = {}
        if response.code != 200 or not isinstance(answer, dict):
            message = answer.get("message", "") if isinstance(answer, dict) else ""
            self.log.warning("gpuhub: the notification feed answered %s %s", response.code, message)
            retry = response.headers.get("Retry-After", "") if response.headers else ""
            wait = float(retry) if retry.isdigit() else BACKOFF_S
            return response.code if response.code in (404, 429) else 502, {
                "message": f"Notifications: the pool service answered {response.code} {message}".strip(),
                "poll_after_s": wait}
        events = [e for e in answer.get("events", []) if isinstance(e, dict)]
        return 200, {"events": events, "poll_after_s": float(answer.get("poll_after_s") or 5.0)}


def handler():
    """The handler (made here: jupyter-server is imported only when the extension loads)."""
    from jupyter_server.base.handlers import APIHandler

    class NotificationsHandler(APIHandler):
        # An open tab polls this: looking is not activity (as gpuhub/status).
        _track_activity = False

        @web.authenticated
        async def get(self):
            status, answer = await self.settings["gpuhub_lab_feed"].take()
            self.set_status(status)
            self.set_header("Cache-Control", "no-store")
            self.finish(json.dumps(answer))

    return NotificationsHandler


def load(serverapp) -> None:
    web_app = serverapp.web_app
    web_app.settings["gpuhub_lab_feed"] = LabFeed(serverapp.log)
    base = web_app.settings["base_url"]
    web_app.add_handlers(".*$", [(_join(base, "gpuhub", "notifications"), handler())])
