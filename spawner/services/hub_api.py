"""The hub's REST API as the gpu-pool service calls it, with the service's own token.

The service's role (settings/pool_service.py) lets it list users and their running
servers (with the spawner's state: profile and lease), see their activity, stop a
server, and make (then delete) a short-lived token of one user for that user's own
server, which is how an action script reaches a server (scripts.py); nothing else.
Its own token never leaves the service: docs/how-it-works/security.md names each scope.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from urllib.parse import quote

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from ..pool.validation import iso_time

# Scopes the service's role holds (read by service.py when it writes the role).
SERVICE_SCOPES = ("list:users", "read:users:groups", "read:users:activity", "read:servers",
                  "admin:server_state", "delete:servers",
                  # a cull warning's signed "keep it" link counts as activity of that one server
                  # (notify/cull_warning.py, handlers/notifications.py)
                  "users:activity",
                  # an action script (only for a pool admin who holds custom:gpu-pool:exec)
                  # reaches a server with a token of the server's own user, scoped to that one
                  # server, that the service makes for it and deletes after (scripts.py); the
                  # service itself holds no access to anyone's server
                  "tokens")
# How long a token made for one script request lives, past the script's own timeout: the
# request's connect and answer margins (scripts.py); it is deleted once the request ends.
SERVER_TOKEN_MARGIN = 120


class HubUnavailable(RuntimeError):
    """The hub did not answer as expected (answered with 502 by the page)."""


@dataclass(frozen=True)
class Server:
    """A running (or starting) server, as the hub sees it."""

    user: str
    name: str  # "" for the default server
    groups: tuple[str, ...] = ()
    profile: str = ""
    ready: bool = False
    last_activity: datetime | None = None
    lease_id: int | None = None
    gpu_uuids: tuple[str, ...] = field(default_factory=tuple)
    url: str = ""  # its path behind the hub's proxy ("/user/pat/"), from the hub's server model
    started: datetime | None = None
    host: str = ""  # the GPU lease's host

    @property
    def state(self) -> dict:
        """The part of the spawner's state the culler's rule reads (culling.policy.is_gpu_server)."""
        return {"gpu_lease_id": self.lease_id, "gpu_uuids": list(self.gpu_uuids)}

    @property
    def label(self) -> str:
        return f"{self.user}/{self.name}" if self.name else self.user


def servers_of(user: dict) -> list[Server]:
    """The servers in one user model of the hub's REST API."""
    out = []
    for name, s in (user.get("servers") or {}).items():
        state = s.get("state") or {}
        profile = state.get("profile") or (s.get("user_options") or {}).get("profile") or ""
        activity = s.get("last_activity")
        started = s.get("started")
        out.append(Server(
            started=iso_time(started) if started else None, host=state.get("gpu_host") or "",
            user=user["name"], name=name, groups=tuple(user.get("groups") or ()), profile=profile,
            ready=bool(s.get("ready")), last_activity=iso_time(activity) if activity else None,
            lease_id=state.get("gpu_lease_id"), gpu_uuids=tuple(state.get("gpu_uuids") or ()),
            url=s.get("url") or ""))
    return out


class HubAPI:
    def __init__(self, url: str | None = None, token: str | None = None):
        self.url = (url or os.environ.get("JUPYTERHUB_API_URL", "http://127.0.0.1:8081/hub/api")).rstrip("/")
        self.token = token or os.environ.get("JUPYTERHUB_API_TOKEN", "")

    async def _call(self, method: str, path: str, ok=(200,), **kwargs):
        request = HTTPRequest(self.url + path, method=method, request_timeout=20,
                              headers={"Authorization": f"token {self.token}",
                                       "Accept": "application/jupyterhub-pagination+json"},
                              allow_nonstandard_methods=True, **kwargs)
        try:
            response = await AsyncHTTPClient().fetch(request, raise_error=False)
        except (OSError, HTTPClientError) as exc:
            raise HubUnavailable(f"The hub's API did not answer: {exc}") from None
        if response.code not in ok:
            raise HubUnavailable(f"The hub's API answered {method} {path} with {response.code}")
        return response

    async def active_servers(self) -> list[Server]:
        """Every server the hub has running or starting, page by page."""
        servers: list[Server] = []
        offset = 0
        while True:
            r = await self._call("GET", f"/users?state=active&limit=200&offset={offset}")
            page = json.loads(r.body)
            items = page["items"] if isinstance(page, dict) else page
            for user in items:
                servers.extend(servers_of(user))
            nxt = page.get("_pagination", {}).get("next") if isinstance(page, dict) else None
            if not nxt:
                return servers
            offset = nxt["offset"]

    async def servers_of_user(self, name: str) -> list[Server]:
        """One user's running or starting servers (an empty list for an unknown user)."""
        r = await self._call("GET", f"/users/{quote(name, safe='')}", ok=(200, 404))
        if r.code == 404:
            return []
        return servers_of(json.loads(r.body))

    async def groups_of(self, name: str) -> tuple[str, ...]:
        """A user's hub groups (empty for an unknown user)."""
        r = await self._call("GET", f"/users/{quote(name, safe='')}", ok=(200, 404))
        return () if r.code == 404 else tuple(json.loads(r.body).get("groups") or ())

    async def server_token(self, user: str, server: str, note: str, expires_in: int) -> tuple[str, str]:
        """(token, its id): a token owned by `user` whose one scope is access to their server
        `server` ("" for the default), expiring in `expires_in` seconds (JupyterHub's
        `POST users/<name>/tokens`, which checks the user holds that scope themselves)."""
        body = {"note": note, "expires_in": int(expires_in),
                "scopes": [f"access:servers!server={user}/{server}"]}
        r = await self._call("POST", f"/users/{quote(user, safe='')}/tokens", ok=(201,), body=json.dumps(body))
        model = json.loads(r.body)
        return model["token"], model["id"]

    async def drop_token(self, user: str, token_id: str) -> None:
        """Delete a token `server_token` made (already gone is fine: it expired)."""
        await self._call("DELETE", f"/users/{quote(user, safe='')}/tokens/{quote(token_id, safe='')}",
                         ok=(204, 404))

    async def record_activity(self, user: str, server: str, when: datetime) -> None:
        """Tell the hub `user`'s server `server` was active at `when` (what the culler reads)."""
        stamp = when.isoformat()
        body = {"last_activity": stamp, "servers": {server: {"last_activity": stamp}}}
        await self._call("POST", f"/users/{quote(user, safe='')}/activity", ok=(200,), body=json.dumps(body))

    async def stop_server(self, user: str, server: str) -> bool:
        """Ask the hub to stop a server: True when it stopped, False while it stops (202)."""
        path = f"/users/{quote(user, safe='')}/" + (f"servers/{quote(server, safe='')}" if server else "server")
        r = await self._call("DELETE", path, ok=(202, 204))
        return r.code == 204


class ServerReads:
    """Named users' servers, read from the hub one user at a time (`GET /users/<name>`), never
    by listing every active user: each user's answer is kept `max_age` seconds and shared by the
    requests that ask meanwhile (one read in flight per user), at most `parallel` reads at once."""

    def __init__(self, api, max_age: float, parallel: int = 8, clock: Callable[[], float] = time.monotonic):
        self.api, self.max_age, self.clock = api, max_age, clock
        self._kept: dict[str, tuple[float, list[Server]]] = {}
        self._reading: dict[str, asyncio.Future] = {}
        self._parallel = asyncio.Semaphore(parallel)

    async def of(self, names: Iterable[str]) -> list[Server]:
        """The servers of `names` (HubUnavailable when the hub fails for any of them)."""
        found = await asyncio.gather(*(self._one(n) for n in dict.fromkeys(names)), return_exceptions=True)
        for f in found:
            if isinstance(f, BaseException):
                raise f
        return [s for servers in found if not isinstance(servers, BaseException) for s in servers]

    async def _one(self, name: str) -> list[Server]:
        kept = self._kept.get(name)
        if kept is not None and self.clock() - kept[0] < self.max_age:
            return kept[1]
        reading = self._reading.get(name)
        if reading is None:
            reading = self._reading[name] = asyncio.ensure_future(self._read(name))
            reading.add_done_callback(lambda _: self._reading.pop(name, None))
        return await asyncio.shield(reading)

    async def _read(self, name: str) -> list[Server]:
        async with self._parallel:
            servers = await self.api.servers_of_user(name)
        now = self.clock()
        if len(self._kept) > 1000:  # keep only fresh answers: memory bounded by the callers of a few seconds
            self._kept = {n: k for n, k in self._kept.items() if now - k[0] < self.max_age}
        self._kept[name] = (now, servers)
        return servers
