"""Channels relayed between a person's SSH client and the sshd in their container.

A session channel (shell, command, SFTP subsystem) on the gateway opens the same request on
the container's sshd: terminal type, size and modes, the environment asyncssh received,
the command or subsystem.  Then bytes flow both ways with SSH's own flow control (a side
that cannot take more pauses the other), stderr stays stderr, window changes, breaks and
signals pass on, and the exit status (or signal) comes back.  Port forwards are tunnelled
by asyncssh itself (Gateway.connection_requested).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import asyncssh

log = logging.getLogger("gpu-ssh")


class UpstreamSession(asyncssh.SSHClientSession):
    """The container's side of one relayed session: what sshd sends goes to the person."""

    def __init__(self, down: DownstreamSession):
        self.down = down
        self.exit_status: int | None = None
        self.exit_signal: tuple | None = None

    def data_received(self, data, datatype):
        self.down.touch()
        self.down.channel.write(data, datatype)

    def eof_received(self):
        self.down.channel.write_eof()
        return True

    def exit_status_received(self, status):
        self.exit_status = status

    def exit_signal_received(self, signal, core_dumped, msg, lang):
        self.exit_signal = (signal, core_dumped, msg, lang)

    def pause_writing(self):
        self.down.channel.pause_reading()

    def resume_writing(self):
        self.down.channel.resume_reading()

    def connection_lost(self, exc):
        self.down.upstream_closed(self)


class DownstreamSession(asyncssh.SSHServerSession):
    """The person's side of one relayed session, opened on the container once it started."""

    def __init__(self, gateway_conn):
        self.gw = gateway_conn  # gateway.Connection
        self.chan: asyncssh.SSHServerChannel | None = None
        self.up_chan: asyncssh.SSHClientChannel | None = None
        self.command: str | None = None
        self.subsystem: str | None = None
        self.term: tuple | None = None
        self._task: asyncio.Task | None = None
        self._closed = False
        self._early: list[bytes] = []  # what the client sent before the container's side opened
        self._early_eof = False

    @property
    def channel(self) -> asyncssh.SSHServerChannel:
        """The person's channel: asyncssh sets it (connection_made) before the session starts,
        so before the container's side opens."""
        assert self.chan is not None
        return self.chan

    def touch(self) -> None:
        self.gw.touch()

    # -- what the client asks for, before the session starts
    def connection_made(self, chan):
        self.chan = chan
        self.gw.channel_opened(self)

    def pty_requested(self, term_type, term_size, term_modes):
        self.term = (term_type, term_size, term_modes)
        return True

    def shell_requested(self):
        return True

    def exec_requested(self, command):
        self.command = command
        return True

    def subsystem_requested(self, subsystem):
        if subsystem != "sftp":
            return False
        self.subsystem = subsystem
        return True

    def session_started(self):
        self._task = asyncio.ensure_future(self._open_upstream())
        # asyncssh resumes reading right after this returns: pause on the next turn, so what
        # arrives before the container's side is open is at most one SSH window (kept below).
        asyncio.get_running_loop().call_soon(self._hold)

    def _hold(self) -> None:
        if self.up_chan is None and not self._closed and self.chan is not None:
            self.chan.pause_reading()

    async def _open_upstream(self):
        try:
            upstream = await self.gw.upstream(self.chan)
            kwargs: dict[str, Any] = {}
            if self.term:
                term_type, term_size, term_modes = self.term
                kwargs.update(term_type=term_type, term_size=term_size, term_modes=term_modes)
            env = dict(self.channel.get_environment())
            self.up_chan, _ = await upstream.create_session(
                lambda: UpstreamSession(self), command=self.command, subsystem=self.subsystem,
                env=env or (), encoding=None, **kwargs)
        except asyncio.CancelledError:
            return
        except Exception as exc:  # said to the person, never a traceback
            message = getattr(exc, "user_message", None) or "Could not reach your server's SSH service"
            log.warning("%s: session not opened: %s", self.gw.name, exc)
            self._fail(message)
            return
        if self._closed:
            self.up_chan.close()
            return
        for data in self._early:
            self.up_chan.write(data)
        self._early = []
        if self._early_eof:
            self.up_chan.write_eof()
        self.channel.resume_reading()

    def _fail(self, message: str) -> None:
        if self._closed or self.chan is None:
            return
        try:
            self.chan.write_stderr((message.rstrip() + "\r\n").encode())
            self.chan.exit(255)
        except (OSError, asyncssh.Error, BrokenPipeError):
            pass

    # -- traffic from the client
    def data_received(self, data, datatype):
        self.touch()
        if self.up_chan is not None:
            self.up_chan.write(data)
        else:
            self._early.append(data)

    def eof_received(self):
        if self.up_chan is not None:
            self.up_chan.write_eof()
        else:
            self._early_eof = True
        return True

    def terminal_size_changed(self, width, height, pixwidth, pixheight):
        if self.up_chan is not None:
            self.up_chan.change_terminal_size(width, height, pixwidth, pixheight)

    def break_received(self, msec):
        if self.up_chan is not None:
            self.up_chan.send_break(msec)
            return True
        return False

    def signal_received(self, signal):
        if self.up_chan is not None:
            self.up_chan.send_signal(signal)

    def pause_writing(self):
        if self.up_chan is not None:
            self.up_chan.pause_reading()

    def resume_writing(self):
        if self.up_chan is not None:
            self.up_chan.resume_reading()

    # -- endings
    def upstream_closed(self, up: UpstreamSession) -> None:
        chan = self.chan
        if self._closed or chan is None:
            return
        try:
            if up.exit_status is not None:
                chan.exit(up.exit_status)
            elif up.exit_signal is not None:
                chan.exit_with_signal(*up.exit_signal)
            else:
                chan.close()
        except (OSError, asyncssh.Error):
            pass

    def connection_lost(self, exc):
        self._closed = True
        self.gw.channel_closed(self)
        if self._task is not None and not self._task.done():
            self._task.cancel()
        if self.up_chan is not None:
            self.up_chan.close()
