"""Per-server SSH keys and where a server's sshd is: what the spawner writes, the gateway reads.

One directory per server under the state directory (`<data>/ssh/servers/`), mode 0700,
owned by the hub's user (the gateway is a process of the hub):

- `client_key`: the private key the gateway logs in to the server's sshd with.  Its
  public half is the only key that sshd accepts.  It never enters the container.
- `host_key`: the private host key the server's sshd proves itself with, handed to the
  container at start; the gateway checks the public half, so it talks to this
  server's sshd and no other.
- `endpoint.json`: where the running server's sshd listens (address, port, login),
  written when the server started, removed when it stops.

The keys are made once per server and kept, so a container kept between starts
(DockerSpawner's `remove=False`) still carries the right ones.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import quote

import asyncssh

# The port sshd listens on inside a notebook container (not published on the host).
CONTAINER_SSH_PORT = 2222
# A login name sshd (and a passwd entry) can carry; others log in as the image's user name.
_POSIX_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
FALLBACK_LOGIN = "jovyan"


def login_name(username: str) -> str:
    """The account name the user has inside their container: their hub name where it is a
    valid POSIX name, else the image's `jovyan` (the uid is theirs either way)."""
    return username if _POSIX_NAME.fullmatch(username) else FALLBACK_LOGIN


@dataclass(frozen=True)
class Endpoint:
    """Where a running server's sshd listens, as the hub reaches it."""

    host: str
    port: int
    login: str


def _private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def _write_private(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    tmp.replace(path)


class ServerKeys:
    """The SSH material of one server (`user`'s server `server`, "" the default one)."""

    def __init__(self, state_dir: str | Path, user: str, server: str = ""):
        self.user = user
        self.server = server
        # Names are escaped: a hub name may hold characters a path must not.
        self.dir = Path(state_dir) / "servers" / quote(user, safe="") / (quote(server, safe="") or "_default")

    @property
    def client_key_file(self) -> Path:
        return self.dir / "client_key"

    @property
    def host_key_file(self) -> Path:
        return self.dir / "host_key"

    @property
    def endpoint_file(self) -> Path:
        return self.dir / "endpoint.json"

    def ensure(self) -> None:
        """Make the keys unless they exist (then they are kept)."""
        _private_dir(self.dir)
        for path in (self.client_key_file, self.host_key_file):
            if not path.exists():
                _write_private(path, asyncssh.generate_private_key("ssh-ed25519").export_private_key())

    def client_key(self) -> asyncssh.SSHKey:
        return asyncssh.read_private_key(str(self.client_key_file))

    def host_key(self) -> asyncssh.SSHKey:
        return asyncssh.read_private_key(str(self.host_key_file))

    def container_env(self, port: int, username: str) -> dict[str, str]:
        """What the container's start-sshd.sh needs: the key it accepts, its host key, port, login."""
        self.ensure()
        return {
            "GPUHUB_SSH_AUTHORIZED_KEY": self.client_key().export_public_key().decode().strip(),
            "GPUHUB_SSH_HOST_KEY": self.host_key_file.read_text(),  # as written: the same at every start
            "GPUHUB_SSH_PORT": str(port),
            "GPUHUB_SSH_LOGIN": login_name(username),
        }

    def publish(self, endpoint: Endpoint) -> None:
        _private_dir(self.dir)
        _write_private(self.endpoint_file, json.dumps(asdict(endpoint)).encode())

    def withdraw(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.endpoint_file.unlink()

    def endpoint(self) -> Endpoint | None:
        try:
            data = json.loads(self.endpoint_file.read_text())
        except (FileNotFoundError, ValueError):
            return None
        return Endpoint(host=str(data["host"]), port=int(data["port"]), login=str(data["login"]))
