"""The SSH server people connect to: logins, limits, and one relayed connection to their own
container per SSH connection.

Nothing here runs a command or touches a file itself: after the login, every channel goes
to the sshd inside the person's own container (bridge.py), found by the name the login
proved, so nobody reaches anyone else's.  With no server running, the first channel starts
one (the person's last profile, else the default) through the hub's REST API and tells
them so on stderr, the spawn's own progress messages (queue position included) with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from pathlib import Path
from typing import Any, cast

import asyncssh
from asyncssh.forward import SSHForwarder

from .bridge import DownstreamSession
from .hub_client import HubClient, HubUnavailable
from .logins import Logins
from .server_keys import ServerKeys
from .throttle import FailureThrottle, source_key

log = logging.getLogger("gpu-ssh")
LOOPBACK = {"localhost", "127.0.0.1", "::1", "ip6-localhost"}
# AES-GCM only: asyncssh encrypts with it about 3x faster than with chacha20-poly1305, which
# OpenSSH clients would pick first if offered (bench/bench_ssh.py), and every relayed byte is
# decrypted and encrypted again on each leg.  Every maintained client has it (OpenSSH >= 6.2, PuTTY >= 0.76).
CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")
HOST_KEY_TYPES: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("ssh_host_ed25519_key", "ssh-ed25519", {}),
    ("ssh_host_rsa_key", "ssh-rsa", {"key_size": 3072}),
)


class UserFacingError(RuntimeError):
    """An error whose message is for the person at the SSH client."""

    def __init__(self, message: str):
        super().__init__(message)
        self.user_message = message


def host_keys(directory: str | Path) -> list[asyncssh.SSHKey]:
    """The gateway's host keys, made in `directory` (0700) on the first start and kept."""
    path = Path(directory)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    keys = []
    for name, algorithm, options in HOST_KEY_TYPES:
        key_file = path / name
        if not key_file.exists():
            key = asyncssh.generate_private_key(algorithm, **options)
            key.write_private_key(str(key_file))
            key_file.chmod(0o600)
            key.write_public_key(str(key_file) + ".pub")
            log.info("Made the SSH gateway's %s host key in %s", algorithm, key_file)
        keys.append(asyncssh.read_private_key(str(key_file)))
    return keys


class CountedForwarder(SSHForwarder):
    """A port forward's gateway end: counts as a channel of its connection, and as traffic."""

    def __init__(self, peer, conn: Connection):
        super().__init__(peer)
        self._conn = conn
        conn.channel_opened(self)

    def data_received(self, data, datatype=None):
        self._conn.touch()
        super().data_received(data, datatype)

    def connection_lost(self, exc):
        self._conn.channel_closed(self)
        super().connection_lost(exc)


class Connection(asyncssh.SSHServer):
    """One person's SSH connection to the gateway."""

    def __init__(self, gateway: Gateway):
        self.gateway = gateway
        self.conn: asyncssh.SSHServerConnection | None = None
        self.source = "?"
        self.source_group = "?"  # the source as the limits and the throttle count it (an IPv6 /64)
        self.name: str | None = None  # the hub name, once logged in
        self.failures = 0
        self.channels: set = set()
        self.opened = time.monotonic()
        self.last_traffic = self.opened
        self._upstream: asyncssh.SSHClientConnection | None = None
        self._upstream_lock = asyncio.Lock()

    @property
    def settings(self) -> dict:
        return self.gateway.settings

    def touch(self) -> None:
        self.last_traffic = time.monotonic()

    # -- connection and login
    def connection_made(self, conn):
        self.conn = conn
        peer = conn.get_extra_info("peername") or ("?", 0)
        self.source = str(peer[0])
        self.source_group = source_key(self.source)
        if not self.gateway.admit(self):
            conn.close()

    def begin_auth(self, username):
        return True

    def password_auth_supported(self):
        return True

    def public_key_auth_supported(self):
        return True

    def kbdint_auth_supported(self):
        return False

    async def _checked(self, username: str, check, counts: bool) -> bool:
        conn = self.conn
        assert conn is not None  # set in connection_made, before any login
        throttle = self.gateway.throttle
        keys = (f"source:{self.source_group}", f"account:{self.gateway.account_key(username)}")
        if counts:
            delay = throttle.wait_for(*keys)
            if delay:
                await asyncio.sleep(delay)
        verdict = await check()
        if verdict.ok:
            refusal = self.gateway.user_limit_refusal(verdict.name)
            if refusal:
                conn.send_auth_banner(refusal + "\r\n")
                return False
            self.name = verdict.name
            return True
        if verdict.message:
            conn.send_auth_banner(verdict.message + "\r\n")
        if counts:
            throttle.failed(*keys)
            self.failures += 1
            if self.failures >= self.settings["max_auth_attempts"]:
                conn.disconnect(asyncssh.DISC_NO_MORE_AUTH_METHODS_AVAILABLE,
                                     f"Too many failed logins ({self.failures}); connect again to retry")
        return False

    async def validate_password(self, username, password):
        return await self._checked(username, lambda: self.gateway.logins.password(username, password), True)

    async def validate_public_key(self, username, key):
        # A key the person did not register is no guess at a secret (clients offer every key
        # they hold): it is not slowed down, and OpenSSH then falls back to the password.
        return await self._checked(username, lambda: self.gateway.logins.public_key(username, key), False)

    def auth_completed(self):
        self.gateway.logged_in(self)
        log.info("%s logged in over SSH from %s", self.name, self.source)

    # -- channels
    def channel_opened(self, channel) -> None:
        self.channels.add(channel)
        self.touch()

    def channel_closed(self, channel) -> None:
        self.channels.discard(channel)
        self.touch()

    def _reserve_channel(self, holder) -> None:
        """Count `holder` as an open channel now, in asyncssh's synchronous open callback:
        the channel itself is made on a later turn of the loop, and a burst of opens arrives
        in one read, so a count taken when the channels are made would let the whole burst in."""
        limit = self.settings["max_channels_per_connection"]
        if len(self.channels) >= limit:
            raise asyncssh.ChannelOpenError(
                asyncssh.OPEN_RESOURCE_SHORTAGE,
                f"{len(self.channels)} channels are open on this connection, the most one may hold "
                f"(SSHGateway.max_channels_per_connection = {limit})")
        self.channel_opened(holder)

    def session_requested(self):
        session = DownstreamSession(self)
        self._reserve_channel(session)  # released by the session's connection_lost
        return session

    def connection_requested(self, dest_host, dest_port, orig_host, orig_port):
        if dest_host.lower() not in LOOPBACK:
            raise asyncssh.ChannelOpenError(
                asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED,
                f"Only ports of your own server can be forwarded (localhost:PORT), not {dest_host}")
        slot = object()  # the forward's place until its forwarder holds it
        self._reserve_channel(slot)
        return self._forward(dest_host, dest_port, slot)

    async def _forward(self, dest_host: str, dest_port: int, slot: object):
        try:
            upstream = await self.upstream(None)
            _, peer = await upstream.create_connection(cast(Any, SSHForwarder), dest_host, dest_port)
        except asyncssh.ChannelOpenError:
            raise
        except Exception as exc:
            raise asyncssh.ChannelOpenError(asyncssh.OPEN_CONNECT_FAILED,
                                            getattr(exc, "user_message", "Your server is not reachable")) from None
        finally:
            self.channels.discard(slot)
        return CountedForwarder(peer, self)

    def server_requested(self, listen_host, listen_port):
        return False  # remote forwarding (ssh -R): not offered

    def unix_connection_requested(self, dest_path):
        return False

    def unix_server_requested(self, listen_path):
        return False

    def connection_lost(self, exc):
        self.gateway.forget(self)
        if self._upstream is not None:
            self._upstream.close()

    # -- the person's container
    def _say(self, chan, message: str) -> None:
        if chan is None:
            return
        with contextlib.suppress(OSError, asyncssh.Error):
            chan.write_stderr((message + "\r\n").encode())

    async def upstream(self, chan) -> asyncssh.SSHClientConnection:
        """The connection to the sshd in this person's container (their server started first
        if need be); one per gateway connection, shared by its channels."""
        name = self.name
        assert name is not None  # channels open only after the login
        async with self._upstream_lock:
            if self._upstream is not None and not self._upstream.is_closed():
                return self._upstream
            endpoint = await self.gateway.running_server(name, lambda m: self._say(chan, m))
            keys = ServerKeys(self.gateway.state_dir, name, "")
            trusted = [keys.host_key().convert_to_public()]
            error: Exception | None = None
            for _ in range(20):  # sshd starts with the server; give it a few seconds
                try:
                    self._upstream = await asyncio.wait_for(asyncssh.connect(
                        endpoint.host, endpoint.port, username=endpoint.login, client_keys=[keys.client_key()],
                        known_hosts=(trusted, [], []), agent_path=None, config=[], preferred_auth="publickey",
                        keepalive_interval=30, encoding=None, encryption_algs=CIPHERS), 10)
                    return self._upstream
                except (TimeoutError, OSError, asyncssh.Error) as exc:
                    error = exc
                    await asyncio.sleep(0.5)
            log.warning("%s: the server's sshd at %s:%s did not accept the gateway: %s", self.name,
                        endpoint.host, endpoint.port, error)
            raise UserFacingError("Your server is running but its SSH service does not answer. Its image "
                                  "may be older than SSH access: stop the server on the hub's home page "
                                  "and start it again.")


class Gateway:
    """The listener, every connection, the limits and the activity reports."""

    def __init__(self, settings: dict, state_dir: str | Path, logins: Logins, hub: HubClient):
        self.settings = settings
        self.state_dir = Path(state_dir)
        self.logins = logins
        self.hub = hub
        self.throttle = FailureThrottle(settings["free_failures"], settings["failure_delay"],
                                        settings["max_failure_delay"], settings["failure_window"],
                                        settings["tracked_failures"])
        self.connections: set[Connection] = set()
        self.unauthenticated: Counter = Counter()
        self.by_user: dict[str, set[Connection]] = {}
        self._server: asyncssh.SSHAcceptor | None = None
        self._ticker: asyncio.Task | None = None
        self._starting: dict[str, asyncio.Future] = {}

    async def start(self) -> None:
        s = self.settings
        self._server = await asyncssh.create_server(
            lambda: Connection(self), s["address"], s["port"],
            server_host_keys=host_keys(s["host_key_dir"]), encoding=None,
            login_timeout=s["login_timeout"], agent_forwarding=False, x11_forwarding=False,
            allow_scp=False, keepalive_interval=60, keepalive_count_max=3, encryption_algs=CIPHERS)
        self._ticker = asyncio.create_task(self._tick())
        log.info("SSH gateway on %s:%s", s["address"], s["port"])

    async def stop(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
        if self._server is not None:
            self._server.close()
        for c in list(self.connections):
            if c.conn is not None:
                c.conn.disconnect(asyncssh.DISC_BY_APPLICATION, "The hub's SSH gateway is restarting; "
                                                                "connect again in a moment")
        if self._server is not None:
            await self._server.wait_closed()

    # -- bookkeeping
    def account_key(self, username: str) -> str:
        """The account a login attempt counts against: the name as the hub's authenticator
        normalises it (" Alice", "alice " and "ALICE" are one account), without a domain
        (alice@example.com, Active Directory's UPN form, is the account alice too)."""
        name = username.strip()
        # An authenticator's own rule that refuses the name: the name counts as given.
        with contextlib.suppress(Exception):
            name = self.logins.authenticator.normalize_username(name)
        return name.lower().partition("@")[0].strip()[:128]

    def _displaceable(self, newcomer: Connection) -> Connection | None:
        """The connection still logging in that makes room for `newcomer` when the budget of
        connections not logged in is spent: the oldest one of the source that holds the most,
        if that source holds more than the newcomer's.  A few addresses holding idle
        connections then cannot keep people from other addresses out."""
        waiting = [c for c in self.connections if c.name is None or c not in self.by_user.get(c.name, ())]
        if not waiting:
            return None
        most = max(self.unauthenticated[c.source_group] for c in waiting)
        if most <= self.unauthenticated[newcomer.source_group]:
            return None
        return min((c for c in waiting if self.unauthenticated[c.source_group] == most), key=lambda c: c.opened)

    def admit(self, c: Connection) -> bool:
        s = self.settings
        if self.unauthenticated[c.source_group] >= s["max_unauthenticated_per_source"]:
            log.warning("Connection from %s closed: %d connections from its network are still logging in "
                        "(SSHGateway.max_unauthenticated_per_source)", c.source,
                        self.unauthenticated[c.source_group])
            return False
        waiting = sum(self.unauthenticated.values())
        if waiting >= s["max_unauthenticated"] or len(self.connections) >= s["max_connections"]:
            victim = self._displaceable(c) if waiting else None
            if victim is None:
                limit = ("max_unauthenticated" if waiting >= s["max_unauthenticated"] else "max_connections")
                log.warning("Connection from %s closed: %d connections open, %d of them logging in "
                            "(SSHGateway.%s)", c.source, len(self.connections), waiting, limit)
                return False
            log.warning("Connection from %s (still logging in) closed to make room for one from %s "
                        "(SSHGateway.max_unauthenticated)", victim.source, c.source)
            self.forget(victim)
            if victim.conn is not None:
                victim.conn.disconnect(asyncssh.DISC_TOO_MANY_CONNECTIONS,
                                       "Too many connections are logging in; connect again")
        self.connections.add(c)
        self.unauthenticated[c.source_group] += 1
        return True

    def user_limit_refusal(self, name: str) -> str | None:
        limit = self.settings["max_connections_per_user"]
        held = len(self.by_user.get(name, ()))
        if held >= limit:
            return (f"You have {held} SSH connections open, the most one person may hold "
                    f"(SSHGateway.max_connections_per_user = {limit}); close one and connect again.")
        return None

    def logged_in(self, c: Connection) -> None:
        assert c.name is not None
        self._unauth_done(c)
        self.by_user.setdefault(c.name, set()).add(c)

    def _unauth_done(self, c: Connection) -> None:
        if c.source_group in self.unauthenticated:
            self.unauthenticated[c.source_group] -= 1
            if self.unauthenticated[c.source_group] <= 0:
                del self.unauthenticated[c.source_group]

    def forget(self, c: Connection) -> None:
        if c not in self.connections:
            return
        self.connections.discard(c)
        if c.name is None or c not in self.by_user.get(c.name, ()):
            self._unauth_done(c)
        else:
            self.by_user[c.name].discard(c)
            if not self.by_user[c.name]:
                del self.by_user[c.name]

    # -- time bounds and activity
    async def _tick(self) -> None:
        every = min(5.0, self.settings["activity_interval"])
        last_report = 0.0
        while True:
            await asyncio.sleep(every)
            now = time.monotonic()
            self._enforce_time_bounds(now)
            if now - last_report >= self.settings["activity_interval"]:
                last_report = now
                await self._report_activity()

    def _enforce_time_bounds(self, now: float) -> None:
        idle, lifetime = self.settings["idle_timeout"], self.settings["max_connection_seconds"]
        for c in list(self.connections):
            if c.conn is None or c.name is None:
                continue
            if idle and now - c.last_traffic > idle:
                c.conn.disconnect(asyncssh.DISC_BY_APPLICATION,
                                  f"No traffic for {idle:g} s (SSHGateway.idle_timeout); connect again")
            elif lifetime and now - c.opened > lifetime:
                c.conn.disconnect(asyncssh.DISC_BY_APPLICATION,
                                  f"Connected for {lifetime:g} s, the longest one connection may last "
                                  "(SSHGateway.max_connection_seconds); connect again")

    async def _report_activity(self) -> None:
        """An open session (or port forward) is a person at work: their server is active."""
        for name, conns in list(self.by_user.items()):
            if not any(c.channels for c in conns):
                continue
            try:
                await self.hub.report_activity(name)
            except HubUnavailable as exc:
                log.debug("Activity of %s not reported: %s", name, exc)

    # -- the person's server
    async def running_server(self, name: str, say):
        """Where `name`'s running server's sshd is, their server started first if none runs."""
        keys = ServerKeys(self.state_dir, name, "")
        timeout = self.settings["start_timeout"]
        deadline = time.monotonic() + timeout
        announced = was_pending = False
        seen: list[str] = []

        def relay(event: dict) -> None:
            message = str(event.get("message") or "").strip()
            if message and message not in seen and len(seen) < 100:
                seen.append(message)
                say(f"  {message}")

        progress: asyncio.Task | None = None
        # The POST: JupyterHub answers it only when the spawn is done or slow_spawn_timeout
        # (10 s) passed, so it runs beside the loop, which follows the spawn's progress as
        # soon as the hub says it is pending (a queue wait is over long before the answer).
        starting: asyncio.Task | None = None
        try:
            while time.monotonic() < deadline:
                try:
                    user = await self.hub.user(name)
                except HubUnavailable as exc:
                    log.warning("%s: the hub did not answer: %s", name, exc)
                    raise UserFacingError("The hub did not answer; try again in a minute.") from None
                if user is None:
                    raise UserFacingError("Your account is not known to the hub.")
                server = (user.get("servers") or {}).get("")
                running = bool(server and server.get("ready"))
                pending = bool(server and server.get("pending"))
                if running:
                    endpoint = keys.endpoint()
                    if endpoint is None:
                        raise UserFacingError(
                            "Your server was started before SSH access was turned on: stop it on the hub's "
                            "home page and start it again, then connect.")
                    if announced:
                        say("Your server is ready.")
                    return endpoint
                if not pending and not announced:
                    options = dict((server or {}).get("user_options") or {})
                    profile = options.get("profile") or "the default profile"
                    say(f"No server is running for you: starting one ({profile}). This may take a while.")
                    starting = asyncio.create_task(self.hub.start_server(name, options))
                    announced = True
                elif pending and not announced:
                    say("Your server is starting; waiting for it.")
                    announced = True
                if starting is not None and starting.done():
                    failure = starting.exception()
                    if isinstance(failure, HubUnavailable):
                        raise UserFacingError(f"The hub could not start your server: {failure}") from None
                    if failure is not None:
                        raise failure
                if progress is None and (pending or starting is None or starting.done()):
                    progress = asyncio.create_task(self.hub.progress(name, relay, timeout))
                if pending:
                    was_pending = True
                elif was_pending:  # it was starting and is neither starting nor running: it failed
                    last = seen[-1] if seen else "see the hub's home page"
                    raise UserFacingError(f"Your server did not start: {last}")
                # Until the stream is followed, look again soon: a short wait's messages are on it only while it lasts.
                await asyncio.sleep(1.0 if progress is not None else 0.2)
            raise UserFacingError(f"Your server did not start within {timeout:g} s (SSHGateway.start_timeout); "
                                  "see the hub's home page, then connect again.")
        finally:
            # The hub's spawn goes on without these; only this connection stops listening.
            for task in (progress, starting):
                if task is not None:
                    task.cancel()
