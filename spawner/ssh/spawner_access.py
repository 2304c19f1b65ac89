"""The spawner's part of SSH access: this server's keys into the container, and where its
sshd listens for the gateway.  A mixin of the engines' spawner (both Docker and Swarm)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlparse

from traitlets import Int, Unicode
from traitlets.config import Configurable

from .server_keys import CONTAINER_SSH_PORT, Endpoint, ServerKeys, login_name


def _start_address(result) -> str | None:
    """The server's address from what start() returned: (ip, port) or a URL."""
    if isinstance(result, (tuple, list)) and result:
        return str(result[0])
    if isinstance(result, str):
        return urlparse(result).hostname
    return None


class SSHAccess(Configurable):
    """Hands each server its SSH keys (when the hub's SSH gateway is on) and publishes where
    its sshd listens once it started; withdraws that when it stops.  Its options are set as
    `c.GPUDockerSpawner.ssh_*` (the engines' spawners inherit them) or `c.SSHAccess.ssh_*`."""

    if TYPE_CHECKING:  # from the Spawner this is mixed into
        user: Any
        name: str

    ssh_state_dir = Unicode(
        "",
        config=True,
        help="""Where the SSH gateway's per-server keys live (set by the hub's settings when
        GPUHUB_SSH is on: `<data dir>/ssh`).  Empty (default): no sshd in the servers.
        """,
    )

    ssh_container_port = Int(
        CONTAINER_SSH_PORT,
        config=True,
        help="""Port sshd listens on inside each server's container (as the container's user,
        so above 1023).  Reached over the Docker network only; never published on a host.""",
    )

    def _ssh_keys(self) -> ServerKeys | None:
        if not self.ssh_state_dir:
            return None
        return ServerKeys(self.ssh_state_dir, self.user.name, self.name or "")

    def get_env(self):
        env = cast(Any, super()).get_env()  # the Spawner's (a mixin's next class)
        keys = self._ssh_keys()
        if keys is not None:
            env.update(keys.container_env(self.ssh_container_port, self.user.name))
        return env

    async def start(self):
        keys = self._ssh_keys()
        if keys is not None:
            keys.withdraw()
        result = await cast(Any, super()).start()  # the Spawner's
        address = _start_address(result)
        if keys is not None and address:
            keys.publish(Endpoint(host=address, port=self.ssh_container_port,
                                  login=login_name(self.user.name)))
        return result

    def clear_state(self):
        keys = self._ssh_keys()
        if keys is not None:
            keys.withdraw()
        cast(Any, super()).clear_state()  # the Spawner's
