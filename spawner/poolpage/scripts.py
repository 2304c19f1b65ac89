"""Action scripts: an admin's shell script run in running notebook servers, as their own users.

Each run is a request to the server's own Jupyter server, through the hub's proxy, with
a token the service makes for that one request (`ServerRoute`): owned by the server's user,
its one scope access to that one server, expiring with the script's timeout and deleted
once the request ends.  The server sees only a credential for itself, so a server that
records its requests' headers gains nothing it did not have; the service's own token never
leaves the service.  The gpuhub_scripts extension of the project's images
runs it as the server's process user (never root), with exactly the server's rights, under
`timeout`, and keeps only the first 16 KiB of its output.  The server already runs on the
right host as the right user, so this is the same on one Docker host and on every Swarm
node (which `docker exec` through the hub's engine cannot reach), and no Docker engine
is asked to exec anything.  A deadline here covers a server that does not answer.

A fan-out is a `Run`: an id, per-server results as they come, kept in a bounded
`RunStore` in the service (the audit in the ledger keeps the script and the exit
codes for good).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import secrets
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, field

from ..services.hub_api import SERVER_TOKEN_MARGIN, HubAPI, HubUnavailable, Server

MAX_SCRIPT_BYTES = 64 * 1024
PARALLEL = 8  # servers a fan-out runs in at once, and the scripts' threads
# A fan-out expected to last longer than this (ceil(servers / PARALLEL) x timeout) is
# answered at once with a run id to follow, not kept waiting on: about what a browser,
# a proxy or `requests` waits before it gives up on an answer.
CLIENT_WAIT = 60
MAX_RUNS = 50  # finished runs the service keeps for `GET api/exec/<id>`
MAX_TIMEOUT = 3600
OUTPUT_CAP = 16 * 1024  # bytes of output kept per server
TIMED_OUT = 124  # coreutils `timeout`'s exit status


class BadScript(ValueError):
    """An exec request the service refuses (answered with 400)."""


@dataclass(frozen=True)
class Target:
    """Which running servers a script runs in: one of a profile, a group, a list of users."""

    profile: str | None = None
    group: str | None = None
    users: tuple[str, ...] = ()

    def describe(self) -> str:
        if self.profile:
            return f"profile {self.profile}"
        if self.group:
            return f"group {self.group}"
        return "users " + ", ".join(self.users)


def parse_target(profile: str | None, group: str | None, users) -> Target:
    """Exactly one of profile, group, users (a list, or a comma/space separated string)."""
    if isinstance(users, str):
        users = users.replace(",", " ").split()
    users = tuple(dict.fromkeys(u.strip() for u in (users or ()) if isinstance(u, str) and u.strip()))
    profile, group = (profile or "").strip() or None, (group or "").strip() or None
    if sum(bool(x) for x in (profile, group, users)) != 1:
        raise BadScript("Name exactly one target: a profile, a group, or a list of users")
    return Target(profile, group, users)


def check_script(script, timeout) -> tuple[str, int]:
    """The script with Unix line ends (a browser's textarea sends CRLF, and `sh` reads the
    CR as part of each line), and its timeout; BadScript when either cannot run."""
    if not isinstance(script, str) or not script.strip():
        raise BadScript("The script is empty")
    script = script.replace("\r\n", "\n").replace("\r", "\n")
    if len(script.encode()) > MAX_SCRIPT_BYTES:
        raise BadScript(f"The script is longer than {MAX_SCRIPT_BYTES // 1024} KiB")
    try:
        seconds = int(timeout)
    except (TypeError, ValueError):
        raise BadScript(f"timeout must be a whole number of seconds, not {timeout!r}") from None
    if not 1 <= seconds <= MAX_TIMEOUT:
        raise BadScript(f"timeout must be between 1 and {MAX_TIMEOUT} seconds")
    return script, seconds


def select_servers(servers: list[Server], target: Target) -> list[Server]:
    """The ready servers the target names, in a stable order."""
    if target.profile:
        chosen = [s for s in servers if s.profile == target.profile]
    elif target.group:
        chosen = [s for s in servers if target.group in s.groups]
    else:
        chosen = [s for s in servers if s.user in target.users]
    return sorted((s for s in chosen if s.ready), key=lambda s: (s.user, s.name))


@dataclass
class Result:
    server: str  # user or user/name
    exit_code: int | None  # None: it could not run
    output: str
    truncated: bool = False
    timed_out: bool = False
    error: str | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def cap(raw: bytes) -> tuple[str, bool]:
    text = raw.decode("utf-8", errors="replace")
    if len(raw) <= OUTPUT_CAP:
        return text, False
    return raw[:OUTPUT_CAP].decode("utf-8", errors="replace"), True


def read_capped(chunks) -> tuple[bytes, bool]:
    """The first OUTPUT_CAP bytes of a stream of chunks, and whether there was more.

    Past the cap it reads on and keeps nothing: Docker (20.10) does not end an exec
    whose reader goes away, so a script whose reader stopped would block on a full
    pipe until its time limit instead of finishing.
    """
    kept = bytearray()
    more = False
    for chunk in chunks:
        if not chunk:
            continue
        room = OUTPUT_CAP - len(kept)
        if room > 0:
            kept += chunk[:room]
        if len(chunk) > room:
            more = True
    return bytes(kept), more


@dataclass(frozen=True)
class ServerRoute:
    """How the service reaches users' servers: through the hub's proxy (`proxy_url`, on this
    machine), to each server's `api/gpuhub/script` (the gpuhub_scripts extension of the
    project's images), with a token `hub` makes per request (HubAPI.server_token)."""

    proxy_url: str
    hub: HubAPI
    validate_cert: bool = True

    def script_url(self, server: Server) -> str:
        from jupyterhub.utils import url_path_join

        return url_path_join(self.proxy_url, server.url or f"/user/{server.user}/{server.name}", "api/gpuhub/script")


# What a server's answer says, for an admin, when it is not a result.
SERVER_ERRORS = {
    404: "its image has no gpuhub_scripts extension (GPU JupyterHub's images have it), so no script runs there",
    403: "the server refused the script",
    501: "its image has no `timeout` command (coreutils), so no script runs there",
}


async def run_in_server(route: ServerRoute, server: Server, script: str, timeout: int) -> Result:
    """Run `script` in `server`, as its own user, through its Jupyter server (see ServerRoute)."""
    from tornado.httpclient import AsyncHTTPClient, HTTPRequest

    try:
        token, token_id = await route.hub.server_token(
            server.user, server.name, note="gpu-pool: one action script request (deleted after it)",
            expires_in=timeout + SERVER_TOKEN_MARGIN)
    except (HubUnavailable, KeyError, ValueError) as exc:
        return Result(server.label, None, "", error=f"the hub made no token for its server: {exc}")
    request = HTTPRequest(route.script_url(server), method="POST", body=json.dumps({"script": script,
                                                                                    "timeout": timeout}),
                          headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
                          request_timeout=timeout + 30, connect_timeout=20, follow_redirects=False,
                          validate_cert=route.validate_cert)
    try:
        # The server keeps OUTPUT_CAP bytes: an answer far larger is not a result.
        response = await AsyncHTTPClient(max_body_size=8 * OUTPUT_CAP + 4096).fetch(request, raise_error=False)
    except Exception as exc:  # refused, reset, timed out
        return Result(server.label, None, "", error=f"its server did not answer: {exc}")
    finally:
        # On every path, cancellation by the fan-out's deadline included; a token the hub
        # could not delete now still expires with the script's timeout.
        await asyncio.shield(drop_quietly(route.hub, server.user, token_id))
    if response.code != 200:
        why = SERVER_ERRORS.get(response.code, f"its server answered HTTP {response.code}")
        try:
            message = json.loads(response.body or b"{}").get("message")
        except ValueError:
            message = None
        return Result(server.label, None, "", error=f"{why}: {message}" if message and response.code == 403 else why)
    try:
        body = json.loads(response.body)
        output, truncated = body["output"], bool(body["truncated"])
        code = body["exit_code"]
    except (ValueError, KeyError, TypeError):
        return Result(server.label, None, "", error="its server's answer was not a script result")
    if len(output.encode()) > OUTPUT_CAP:
        output, truncated = cap(output.encode())[0], True
    return Result(server.label, code, output, truncated, timed_out=bool(body.get("timed_out")))


async def drop_quietly(hub: HubAPI, user: str, token_id: str) -> None:
    # Unreachable, it expires by itself within the script's timeout and SERVER_TOKEN_MARGIN.
    with contextlib.suppress(HubUnavailable):
        await hub.drop_token(user, token_id)


_gate: asyncio.Semaphore | None = None


def gate() -> asyncio.Semaphore:
    """PARALLEL scripts at once over all fan-outs: a script's deadline starts when it runs."""
    global _gate
    if _gate is None:
        _gate = asyncio.Semaphore(PARALLEL)
    return _gate


async def run_everywhere(route: ServerRoute, servers: list[Server], script: str, timeout: int,
                         on_result=None) -> list[Result]:
    """The script in every server, PARALLEL at a time (over every fan-out of the service); one
    Result per server, in order.  `on_result(result)` is called as each server finishes.
    Nothing blocks the event loop: each is an HTTP request to the server."""
    async def one(server: Server) -> Result:
        async with gate():
            try:
                # The server's own `timeout` ends the script; this deadline covers a stuck server.
                result = await asyncio.wait_for(run_in_server(route, server, script, timeout), timeout + 45)
            except TimeoutError:
                result = Result(server.label, None, "", timed_out=True, error="its server did not finish in time")
        if on_result is not None:
            on_result(result)
        return result
    return list(await asyncio.gather(*(one(s) for s in servers)))


def expected_seconds(servers: int, timeout: int) -> int:
    """How long a fan-out may take: ceil(servers / PARALLEL) rounds of `timeout`."""
    return math.ceil(servers / PARALLEL) * timeout


def sha256(script: str) -> str:
    return hashlib.sha256(script.encode()).hexdigest()


@dataclass
class Run:
    """One fan-out: who started it, where, and each server's result as it comes."""

    id: str
    actor: str
    target: str
    timeout: int
    script_sha256: str
    servers: list[str]
    started_at: float = field(default_factory=time.time)
    results: dict[str, Result] = field(default_factory=dict)
    done: bool = False
    task: asyncio.Task | None = field(default=None, repr=False)

    def finish_one(self, result: Result) -> None:
        self.results[result.server] = result

    def end(self) -> None:
        """Every server has finished and the audit has their exit codes."""
        self.done = True

    def exit_codes(self) -> str:
        """'bob: exit 0, pat: exit 3, cy: not run (...)', for the audit."""
        def one(r: Result) -> str:
            if r.exit_code is None:
                return f"{r.server}: not run ({r.error or 'timed out'})"
            return f"{r.server}: exit {r.exit_code}" + (" (timed out)" if r.timed_out else "")
        return ", ".join(one(self.results[s]) for s in sorted(self.results))

    def as_dict(self) -> dict:
        rows = []
        for label in self.servers:
            r = self.results.get(label)
            rows.append({"state": "done", **r.as_dict()} if r is not None else
                        {"state": "running", **Result(label, None, "").as_dict()})
        return {"id": self.id, "actor": self.actor, "target": self.target, "timeout": self.timeout,
                "script_sha256": self.script_sha256, "started_at": self.started_at,
                "done": self.done, "results": rows}


class RunStore:
    """The service's last MAX_RUNS runs, by id (the oldest go first)."""

    def __init__(self, max_runs: int = MAX_RUNS):
        self.max_runs = max_runs
        self._runs: OrderedDict[str, Run] = OrderedDict()

    def start(self, actor: str, target: str, servers: list[Server], script: str, timeout: int) -> Run:
        run = Run(secrets.token_urlsafe(9), actor, target, timeout, sha256(script), [s.label for s in servers])
        self._runs[run.id] = run
        while len(self._runs) > self.max_runs:
            self._runs.popitem(last=False)
        return run

    def get(self, run_id: str) -> Run | None:
        return self._runs.get(run_id)
