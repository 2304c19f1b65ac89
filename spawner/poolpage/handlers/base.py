"""The gpu-pool service's base handlers: who is asking, ledger calls off the event loop,
JSON errors that never carry a traceback.  Every handler module of the service builds
on these (app.py only puts the routes together)."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

from jupyterhub.services.auth import HubOAuthCallbackHandler, HubOAuthenticated
from tornado import web

from ...pool import GPUPool
from ...pool.ledger.off_loop import ledger_call
from ...pool.models import InvalidRequest, PoolError, PoolUnavailable, UnknownGPU
from ...pool.validation import MAX_ID
from ...services.callers import AsksTheHubFirst
from .. import ADMIN_SCOPE, EXEC_SCOPE, views

log = logging.getLogger("gpu-pool-page")
NO_EXEC = (f"Running action scripts in other people's servers needs the {EXEC_SCOPE} scope, which pool "
           "admins do not have by default: ask the hub's operator to add you to GPUHUB_POOL_EXEC_USERS "
           "or to a group of GPUHUB_DIRECTORY_EXEC_GROUPS")
# Seconds a ledger call may take before the page answers 503 (as the hub does).
LEDGER_TIMEOUT = 10.0


def path_id(raw: str, not_found: str) -> int:
    """The id in a route's `(\\d+)`: one past 64 bits (or too long for int()) names no row, so
    it is a 404 saying `not_found`, never a database error."""
    if len(raw) > len(str(MAX_ID)) or int(raw) > MAX_ID:
        raise web.HTTPError(404, not_found)
    return int(raw)


if TYPE_CHECKING:
    _Handler = web.RequestHandler
else:
    # A mixin at run time: a RequestHandler base here would put tornado's methods above
    # HubAuthenticated's in BaseHandler's method order.
    _Handler = object


class Unframed(_Handler):
    """No answer of the service may be framed: a user's own server shares the hub's origin
    (without subdomain_host) and could otherwise put an admin's page under its clicks."""

    def set_default_headers(self) -> None:
        super().set_default_headers()
        self.set_header("X-Frame-Options", "DENY")
        self.set_header("Content-Security-Policy", "frame-ancestors 'none'")


class BaseHandler(AsksTheHubFirst, Unframed, HubOAuthenticated, web.RequestHandler):
    """A request of a logged-in hub user, who is a `views.Viewer`.

    Who it is comes from the hub (a token or cookie not in the cache is checked with the hub's
    API): asked in prepare(), asynchronously and within PoolServiceLimits.hub_auth_timeout,
    so the synchronous `current_user` that handlers read never waits on the hub on the loop.
    """

    def hub_auth_timeout(self) -> float:
        return self.settings["limits"].hub_auth_timeout

    @property
    def pool(self) -> GPUPool:
        return self.settings["pool"]

    def viewer(self) -> views.Viewer | None:
        user = self.current_user
        if not user:
            return None
        scopes = set(user.get("scopes", ()))
        return views.Viewer(name=user["name"], admin=ADMIN_SCOPE in scopes, runs_scripts=EXEC_SCOPE in scopes,
                            show_holders=self.settings["show_holders"])

    async def ledger(self, fn, *args, **kwargs):
        """Run a (blocking) ledger call off the event loop, bounded like the hub's own."""
        return await ledger_call(fn, *args, timeout=LEDGER_TIMEOUT, **kwargs)


class APIHandler(BaseHandler):
    """JSON in, JSON out; errors are {"status", "message"}, never a traceback."""

    def require_viewer(self, admin: bool = False, runs_scripts: bool = False) -> views.Viewer:
        viewer = self.viewer()
        if viewer is None:
            raise web.HTTPError(403, "Log in to the hub (or send a hub API token) first")
        if admin and not viewer.admin:
            raise web.HTTPError(403, f"This needs the {ADMIN_SCOPE} scope (a GPU pool admin)")
        if runs_scripts and not viewer.runs_scripts:
            raise web.HTTPError(403, NO_EXEC)
        return viewer

    def json_body(self, max_bytes: int):
        """The request's body parsed as JSON (None when empty); a 400 past `max_bytes` or not JSON."""
        if len(self.request.body) > max_bytes:
            raise web.HTTPError(400, f"The request body is larger than {max_bytes} bytes")
        try:
            return json.loads(self.request.body or b"null")
        except ValueError:
            raise web.HTTPError(400, "The body must be JSON") from None

    def write_json(self, data, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(data))

    def write_error(self, status_code: int, **kwargs) -> None:
        message = self._reason
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, web.HTTPError) and exc.log_message:
            message = exc.log_message % exc.args if exc.args else exc.log_message
        elif isinstance(exc, PoolError):
            message = str(exc)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"status": status_code, "message": message}))

    def log_exception(self, typ, value, tb):
        if isinstance(value, (web.HTTPError, PoolError)):
            log.warning("%s %s: %s", self.request.method, self.request.uri, value)
        else:
            super().log_exception(typ, value, tb)

    async def call(self, fn, *args, **kwargs):
        """A ledger call whose pool errors become HTTP errors with their message."""
        try:
            return await self.ledger(fn, *args, **kwargs)
        except UnknownGPU as exc:
            raise web.HTTPError(404, str(exc)) from None
        except InvalidRequest as exc:
            raise web.HTTPError(400, str(exc)) from None
        except PoolUnavailable as exc:
            raise web.HTTPError(503, str(exc)) from None

    def period(self):
        try:
            return views.usage_period(self.get_argument("since", None), self.get_argument("until", None))
        except views.BadInput as exc:
            raise web.HTTPError(400, str(exc)) from None


class OAuthCallback(Unframed, HubOAuthCallbackHandler):
    """The end of the hub's OAuth login into the service."""


class NotFound(APIHandler):
    """Any other path under the service: 404 in JSON, unframed like the rest."""

    def prepare(self):
        raise web.HTTPError(404, "No such page or API in the GPU pool service")
