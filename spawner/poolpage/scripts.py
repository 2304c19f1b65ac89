"""Action scripts: an admin's shell script run in running notebook servers, as their own users.

Each run is a `docker exec` in the server's container with the container's own
user (the person's uid:gid; a container that would run it as root is
refused), not privileged, so it has exactly the container's rights: no
capabilities, no new privileges.  It is bounded by `timeout` inside the
container and by a deadline here; its output is capped.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass

from ..labels import LABEL_POOL, LABEL_SERVER, LABEL_USER
from .hubapi import Server

MAX_SCRIPT_BYTES = 64 * 1024
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
    if not isinstance(script, str) or not script.strip():
        raise BadScript("The script is empty")
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


def runs_as_root(user: str) -> bool:
    return user.split(":")[0] in ("", "0", "root")


def exec_in(client, pool_id: str, server: Server, script: str, timeout: int) -> Result:
    """Run `script` in `server`'s container (blocking; call on a thread)."""
    import docker.errors

    labels = [f"{LABEL_POOL}={pool_id}", f"{LABEL_USER}={server.user}", f"{LABEL_SERVER}={server.name}"]
    try:
        found = client.containers.list(filters={"label": labels, "status": "running"})
    except docker.errors.DockerException as exc:
        return Result(server.label, None, "", error=f"Docker did not answer: {exc}")
    if len(found) != 1:
        return Result(server.label, None, "", error="no running container found for this server")
    container = found[0]
    user = container.attrs.get("Config", {}).get("User") or ""
    if runs_as_root(user):
        return Result(server.label, None, "", error="its container runs as root: scripts run only as the server's user")
    cmd = ["timeout", "-k", "5", str(timeout), "sh", "-c", script]
    try:
        exec_id = client.api.exec_create(container.id, cmd, user=user, privileged=False,
                                         stdout=True, stderr=True, stdin=False, tty=False)["Id"]
        raw = client.api.exec_start(exec_id, stream=False, demux=False) or b""
        code = client.api.exec_inspect(exec_id).get("ExitCode")
    except docker.errors.DockerException as exc:
        return Result(server.label, None, "", error=f"docker exec failed: {exc}")
    output, truncated = cap(raw)
    if code in (126, 127) and '"timeout"' in output:
        return Result(server.label, None, output, truncated,
                      error="its image has no `timeout` command (coreutils), so no script runs there")
    return Result(server.label, code, output, truncated, timed_out=code == TIMED_OUT)


async def run_everywhere(client, pool_id: str, servers: list[Server], script: str, timeout: int,
                         parallel: int = 8) -> list[Result]:
    """The script in every server, `parallel` at a time; one Result per server, in order."""
    gate = asyncio.Semaphore(parallel)

    async def one(server: Server) -> Result:
        async with gate:
            try:
                # The in-container `timeout` ends it; this deadline covers a stuck Docker.
                return await asyncio.wait_for(asyncio.to_thread(exec_in, client, pool_id, server, script, timeout),
                                              timeout + 30)
            except TimeoutError:
                return Result(server.label, None, "", timed_out=True, error="Docker did not finish the exec in time")
    return list(await asyncio.gather(*(one(s) for s in servers)))
