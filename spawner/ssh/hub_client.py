"""The hub's REST API as the SSH gateway calls it: with its service token (find, start and
follow a user's server, report SSH activity), or with a token a person gave as password
(who it belongs to, and whether it may reach their server)."""

from __future__ import annotations

import contextlib
import json
import os
from datetime import UTC, datetime
from urllib.parse import quote

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

# What the service's role holds (service.py writes the role from this).
SERVICE_SCOPES = ("read:users", "read:servers", "servers", "users:activity")


class HubUnavailable(RuntimeError):
    """The hub did not answer as expected."""


def _user_path(name: str) -> str:
    return f"/users/{quote(name, safe='')}"


class HubClient:
    def __init__(self, url: str | None = None, token: str | None = None, timeout: float = 20.0):
        self.url = (url or os.environ.get("JUPYTERHUB_API_URL", "http://127.0.0.1:8081/hub/api")).rstrip("/")
        self.token = token or os.environ.get("JUPYTERHUB_API_TOKEN", "")
        self.timeout = timeout

    async def _call(self, method: str, path: str, token: str | None = None, body=None,
                    ok=(200,), timeout: float | None = None):
        request = HTTPRequest(
            self.url + path, method=method,
            request_timeout=timeout or self.timeout, connect_timeout=self.timeout,
            headers={"Authorization": f"token {token or self.token}", "Content-Type": "application/json"},
            body=json.dumps(body) if body is not None else (b"" if method in ("POST", "PUT") else None),
            allow_nonstandard_methods=True)
        try:
            response = await AsyncHTTPClient().fetch(request, raise_error=False)
        except (OSError, HTTPClientError) as exc:
            raise HubUnavailable(f"the hub's API did not answer: {exc}") from None
        if response.code == 599:
            raise HubUnavailable(f"the hub's API did not answer: {response.error}")
        if response.code not in ok:
            raise HubUnavailable(f"the hub's API answered {method} {path} with {response.code}: "
                                 f"{_message(response.body)}")
        return response

    async def token_owner(self, token: str) -> dict | None:
        """The model of whoever `token` belongs to (with its scopes), or None if the hub refuses it."""
        r = await self._call("GET", "/user", token=token, ok=(200, 401, 403))
        return json.loads(r.body) if r.code == 200 else None

    async def user(self, name: str) -> dict | None:
        """The user's model with their stopped servers too (for the last profile), or None."""
        r = await self._call("GET", _user_path(name) + "?include_stopped_servers=1", ok=(200, 404))
        return json.loads(r.body) if r.code == 200 else None

    async def start_server(self, name: str, options: dict) -> int:
        """POST the server: 201 (started), 202 (starting), 400 (already starting/running)."""
        r = await self._call("POST", _user_path(name) + "/server", body=options, ok=(201, 202, 400))
        if r.code == 400:
            message = _message(r.body)
            if "already" not in message.lower() and "pending" not in message.lower():
                raise HubUnavailable(message)
        return r.code

    async def progress(self, name: str, on_event, timeout: float) -> None:
        """Follow the spawn's progress stream, calling on_event(dict) per event, until it ends."""
        buffer = b""

        def chunk(data: bytes) -> None:
            nonlocal buffer
            buffer += data
            while b"\n\n" in buffer:
                block, buffer = buffer.split(b"\n\n", 1)
                for line in block.splitlines():
                    if line.startswith(b"data:"):
                        with contextlib.suppress(ValueError):
                            on_event(json.loads(line[5:].strip() or b"{}"))

        request = HTTPRequest(self.url + _user_path(name) + "/server/progress", method="GET",
                              request_timeout=timeout, connect_timeout=self.timeout,
                              headers={"Authorization": f"token {self.token}", "Accept": "text/event-stream"},
                              streaming_callback=chunk)
        with contextlib.suppress(OSError, HTTPClientError):  # the caller checks the server's state itself
            await AsyncHTTPClient().fetch(request, raise_error=False)

    async def report_activity(self, name: str, server: str = "") -> None:
        now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
        await self._call("POST", _user_path(name) + "/activity", ok=(200, 204),
                         body={"last_activity": now, "servers": {server: {"last_activity": now}}})


def _message(body: bytes | None) -> str:
    try:
        return str(json.loads(body or b"{}").get("message", ""))[:500]
    except (ValueError, AttributeError):
        return (body or b"")[:200].decode("utf-8", "replace")
