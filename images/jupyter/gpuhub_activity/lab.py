"""What the in-lab extension (labextension/, `gpuhub-lab`) reads: GET gpuhub/status, POST gpuhub/keep.

The browser never talks to the hub: this server asks the hub's gpu-pool service
(`api/lab`) with its own token ($JUPYTERHUB_API_TOKEN, whose scopes include access
to that service) at $GPUHUB_POOL_URL, and answers only the logged-in owner of this
server (jupyter-server's own authentication).  "Keep my server" is activity: it is
recorded here (a `*_last_activity` setting, as the busy kernels are) and reported to
the hub at once through the hub's public activity API (POST /users/:name/activity,
what jupyterhub-singleuser itself sends), so the hub's `last_activity`, and with it
the culler's deadline, moves now and not at the next periodic report.
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timezone
from urllib.parse import quote, urlencode

from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from traitlets import Float, default
from traitlets.config import LoggingConfigurable

KEPT_SETTING = "gpuhub_kept_last_activity"
# The pool service's answer is shared by every tab of this server for this long.
CACHE_SECONDS = 3.0
# "Keep my server" reaches the hub at most this often (more clicks change nothing).
KEEP_EVERY = 10.0
REQUEST_TIMEOUT = 10.0
# The panel's chart: each GPU's readings of the last HISTORY_SECONDS, at most HISTORY_POINTS.
HISTORY_SECONDS = 600.0
HISTORY_POINTS = 120


def url_path_join(*pieces: str) -> str:
    """Join URL path pieces with single slashes (as jupyter-server's helper of that name)."""
    joined = "/".join(p.strip("/") for p in pieces if p.strip("/"))
    if pieces and pieces[0].startswith("/"):
        joined = "/" + joined
    if pieces and pieces[-1].endswith("/"):
        joined += "/"
    return joined


def _now() -> datetime:
    return datetime.now(timezone.utc)


class LabStatus(LoggingConfigurable):
    """The in-lab GPU status: where the pool service is and when to warn before a cull."""

    warn_before = Float(
        help="Seconds before an idle cull at which JupyterLab warns, with a \"Keep my server\" "
        "button (in the notebook server's jupyter_server_config, or the container's environment "
        "variable GPUHUB_CULL_WARN_BEFORE).  Default 600 (10 minutes).",
    ).tag(config=True)

    @default("warn_before")
    def _default_warn_before(self):
        try:
            return float(os.environ.get("GPUHUB_CULL_WARN_BEFORE", "600"))
        except ValueError:
            return 600.0

    poll_interval = Float(
        10.0,
        help="Seconds between the status bar's refreshes while the JupyterLab tab is visible "
        "(six times longer while it is hidden).",
    ).tag(config=True)

    def __init__(self, serverapp, **kwargs):
        super().__init__(parent=serverapp, **kwargs)
        self.serverapp = serverapp
        # The hub sets these in every server it spawns; without them (a plain `jupyter lab`)
        # the status says so instead of failing.
        self.pool_url = os.environ.get("GPUHUB_POOL_URL") or os.environ.get("GPUHUB_JOBS_URL", "")
        self.token = os.environ.get("JUPYTERHUB_API_TOKEN", "")
        self.hub_api = os.environ.get("JUPYTERHUB_API_URL", "")
        self.user = os.environ.get("JUPYTERHUB_USER", "")
        self.server_name = os.environ.get("JUPYTERHUB_SERVER_NAME", "")
        self._cached: tuple[float, dict] | None = None
        self._kept_at = 0.0
        self._history: dict[str, list[tuple[float, float]]] = {}

    def _remember(self, data: dict) -> None:
        """Keep the readings of this server's GPUs, so the chart shows the last minutes, also
        right after a reload of the page (bounded in time and in points)."""
        now = time.time()
        gpus = (data.get("lease") or {}).get("gpus") or []
        for uuid in [u for u in self._history if u not in {g["uuid"] for g in gpus}]:
            del self._history[uuid]
        for g in gpus:
            points = self._history.setdefault(g["uuid"], [])
            if g.get("utilization") is not None:
                points.append((now, float(g["utilization"])))
            self._history[g["uuid"]] = [p for p in points if now - p[0] <= HISTORY_SECONDS][-HISTORY_POINTS:]
        data["history"] = {u: [[round(t, 1), v] for t, v in pts] for u, pts in self._history.items()}

    def _fetch(self, url: str, **kwargs) -> HTTPRequest:
        return HTTPRequest(url, headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
                           request_timeout=REQUEST_TIMEOUT, connect_timeout=REQUEST_TIMEOUT, **kwargs)

    def _extra(self, data: dict) -> dict:
        return {**data, "warn_before_s": self.warn_before, "poll_s": self.poll_interval}

    async def status(self, fresh: bool = False) -> dict:
        if not (self.pool_url and self.token):
            return self._extra({"available": False, "message": "GPU status: not started by the hub's GPU pool"})
        if not fresh and self._cached and time.monotonic() - self._cached[0] < CACHE_SECONDS:
            return self._cached[1]
        url = url_path_join(self.pool_url, "api", "lab") + "?" + urlencode({"server": self.server_name})
        try:
            response = await AsyncHTTPClient().fetch(self._fetch(url), raise_error=False)
        except (OSError, HTTPClientError) as exc:
            self.log.warning("gpuhub: the pool service did not answer: %s", exc)
            return self._extra({"available": False, "message": "GPU status: the pool service did not answer"})
        if response.code != 200:
            try:
                message = json.loads(response.body).get("message", "")
            except ValueError:
                message = ""
            self.log.warning("gpuhub: the pool service answered %s %s", response.code, message)
            return self._extra({"available": False,
                                "message": f"GPU status: the pool service answered {response.code}"})
        data = self._extra({"available": True, **json.loads(response.body)})
        self._remember(data)
        self._cached = (time.monotonic(), data)
        return data

    async def keep(self) -> dict:
        """Record activity now and tell the hub; returns the fresh status (the moved deadline)."""
        now = _now()
        self.serverapp.web_app.settings[KEPT_SETTING] = now
        if time.monotonic() - self._kept_at >= KEEP_EVERY and self.hub_api and self.user:
            stamp = now.isoformat().replace("+00:00", "Z")
            body = {"last_activity": stamp, "servers": {self.server_name: {"last_activity": stamp}}}
            url = url_path_join(self.hub_api, "users", quote(self.user, safe=""), "activity")
            try:
                response = await AsyncHTTPClient().fetch(
                    self._fetch(url, method="POST", body=json.dumps(body)), raise_error=False)
            except (OSError, HTTPClientError) as exc:
                raise web.HTTPError(502, f"The hub did not take the activity: {exc}") from None
            if response.code >= 400:
                raise web.HTTPError(502, f"The hub did not take the activity ({response.code})")
            self._kept_at = time.monotonic()
        return await self.status(fresh=True)


def handlers():
    """The two handlers (made here: this module's traits are read without jupyter-server, for
    the docs' configuration reference)."""
    from jupyter_server.base.handlers import APIHandler

    class StatusHandler(APIHandler):
        # An open tab polls this: looking is not activity, or no server with a tab open would
        # ever be culled (jupyter-server's own switch for such handlers).
        _track_activity = False

        @web.authenticated
        async def get(self):
            self.finish(json.dumps(await self.settings["gpuhub_lab_status"].status()))

    class KeepHandler(APIHandler):
        @web.authenticated
        async def post(self):
            self.finish(json.dumps(await self.settings["gpuhub_lab_status"].keep()))

    return StatusHandler, KeepHandler


def load(serverapp) -> None:
    status_handler, keep_handler = handlers()
    status = LabStatus(serverapp)
    web_app = serverapp.web_app
    web_app.settings["gpuhub_lab_status"] = status
    base = web_app.settings["base_url"]
    web_app.add_handlers(".*$", [(url_path_join(base, "gpuhub", "status"), status_handler),
                                 (url_path_join(base, "gpuhub", "keep"), keep_handler)])
