"""Debian's OpenSSH client against the hub's SSH gateway: `ssh` and `scp` as a person runs them
(used by the tests and bench/bench_ssh.py).

Passwords go in through SSH_ASKPASS (OpenSSH's own mechanism, SSH_ASKPASS_REQUIRE=force),
so no terminal and no extra tool is needed.  Every call has a timeout and its own
known_hosts file unless the test passes one (the host-key checks use it).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from devservices.apt import ensure_packages
from devservices.ports import free_port


def ensure_openssh_client() -> None:
    """Debian's openssh-client, installed if missing (InstallError when it cannot be)."""
    ensure_packages({"ssh": "openssh-client", "scp": "openssh-client"})


def ssh_env(port_page: int | None = None, port: int | None = None) -> dict[str, str]:
    """The hub settings that turn the gateway on, on free ports."""
    return {"GPUHUB_SSH": "true", "GPUHUB_SSH_PORT": str(port or free_port()),
            "GPUHUB_SSH_PAGE_PORT": str(port_page or free_port())}


@dataclass
class SSHResult:
    returncode: int
    stdout: str
    stderr: str
    seconds: float


class SSHClient:
    """OpenSSH's client aimed at one gateway (host:port, 127.0.0.1 unless told)."""

    def __init__(self, port: int, workdir: Path, host: str = "127.0.0.1"):
        ensure_openssh_client()
        self.port = port
        self.host = host
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.known_hosts = workdir / "known_hosts"
        self.askpass = workdir / "askpass.sh"
        self.askpass.write_text('#!/bin/sh\nprintf "%s\\n" "$GPUHUB_TEST_SSH_PASSWORD"\n')
        self.askpass.chmod(0o700)

    def options(self, password: str | None, key: Path | None, strict: bool) -> list[str]:
        opts = ["-F", "/dev/null", "-o", f"UserKnownHostsFile={self.known_hosts}",
                "-o", "StrictHostKeyChecking=" + ("yes" if strict else "accept-new"),
                "-o", "ConnectTimeout=30", "-o", "ServerAliveInterval=10", "-o", "LogLevel=INFO",
                "-o", "NumberOfPasswordPrompts=1", "-o", "IdentityAgent=none"]
        if key is not None:
            opts += ["-o", "PreferredAuthentications=publickey", "-o", "PasswordAuthentication=no",
                     "-o", "IdentitiesOnly=yes", "-i", str(key)]
        else:
            opts += ["-o", "PreferredAuthentications=password", "-o", "PubkeyAuthentication=no"]
        return opts

    def _env(self, password: str | None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SSH_")}
        env.update(SSH_ASKPASS=str(self.askpass), SSH_ASKPASS_REQUIRE="force", DISPLAY=":0",
                   GPUHUB_TEST_SSH_PASSWORD=password or "")
        return env

    def run(self, argv: list[str], password: str | None, timeout: float, given: str | None = None) -> SSHResult:
        """`argv` with the password through askpass; `given`: its standard input (else none)."""
        began = time.monotonic()
        p = subprocess.run(argv, env=self._env(password), input=given,
                           stdin=subprocess.DEVNULL if given is None else None, capture_output=True,
                           text=True, timeout=timeout)
        return SSHResult(p.returncode, p.stdout, p.stderr, time.monotonic() - began)

    def ssh(self, user: str, command: str, password: str | None = None, key: Path | None = None,
            extra: tuple[str, ...] = (), strict: bool = False, timeout: float = 240) -> SSHResult:
        argv = ["ssh", *self.options(password, key, strict), "-p", str(self.port), *extra,
                f"{user}@{self.host}", command]
        return self.run(argv, password, timeout)

    def scp(self, user: str, source: Path, dest: str, password: str | None = None, timeout: float = 240) -> SSHResult:
        argv = ["scp", *self.options(password, None, False), "-P", str(self.port), "-q", str(source),
                f"{user}@{self.host}:{dest}"]
        return self.run(argv, password, timeout)

    def sftp(self, user: str, commands: str, password: str | None = None, timeout: float = 240) -> SSHResult:
        """OpenSSH's sftp running `commands`, one per line, given on its standard input (not
        `-b`, whose batch mode turns password prompts off)."""
        argv = ["sftp", *self.options(password, None, False), "-P", str(self.port), f"{user}@{self.host}"]
        return self.run(argv, password, timeout, given=commands)

    def popen(self, user: str, command: str, password: str | None = None, extra: tuple[str, ...] = ()):
        """A long-running ssh (a forward, a session held open); the caller stops it."""
        argv = ["ssh", *self.options(password, None, False), "-p", str(self.port), *extra,
                f"{user}@{self.host}", command]
        return subprocess.Popen(argv, env=self._env(password), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_gateway(port: int, hub, timeout: float = 60, host: str = "127.0.0.1") -> None:
    """Until the gateway answers with an SSH banner (the hub starts its services after itself)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=2) as s:
                s.settimeout(5)
                if s.recv(64).startswith(b"SSH-2.0-"):
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"the SSH gateway did not listen on {port} within {timeout} s:\n{hub.log_tail(80)}")


def host_key_line(port: int, known_hosts: Path) -> list[str]:
    """The gateway's entries in a known_hosts file."""
    return [line for line in known_hosts.read_text().splitlines() if f"[127.0.0.1]:{port}" in line]
