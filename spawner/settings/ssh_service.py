"""The gpu-ssh service in the hub's config: the service, its role, the spawner's part.

Called by apply_settings when GPUHUB_SSH is on (off by default: it opens a port); its service
and role are `ssh_part`, set by services.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..services.lifecycle import write_when_config_loaded
from ..ssh import SERVICE_NAME
from ..ssh.gateway_settings import FILE_ENV_NAME, INLINE_SECRET_ENV, render_hand_over
from ..ssh.hub_client import SERVICE_SCOPES
from .part import Part

SERVICE_ROLE = "gpu-ssh-service"
ACCESS_SCOPE = f"access:services!service={SERVICE_NAME}"
HAND_OVER = "gateway.json"


def _state_dir(settings) -> Path:
    return settings.data_dir / "ssh"


def ssh_part(settings) -> Part:
    """The gpu-ssh service (gateway + key page), its role, and every user's access to the key
    page (services.py sets them)."""
    # The hand-over holds the authenticator's settings but never the directory's lookup
    # password: the path of the file it came from (GPUHUB_DIRECTORY_BIND_PASSWORD_FILE), or the
    # name of the service's variable that carries it (GPUHUB_DIRECTORY_BIND_PASSWORD given
    # inline), in its place.
    directory = settings.directory
    environment = {FILE_ENV_NAME: str(_state_dir(settings) / HAND_OVER)}
    if directory is not None and directory.bind_password and not directory.bind_password_file:
        environment[INLINE_SECRET_ENV] = directory.bind_password
    return Part(
        services=({"name": SERVICE_NAME,
                   "display": True,
                   "oauth_no_confirm": True,
                   "url": f"http://127.0.0.1:{settings.ssh_page_port}",
                   "command": [sys.executable, "-m", "spawner.ssh"],
                   "environment": environment},),
        roles=({"name": SERVICE_ROLE,
                "description": "The SSH gateway: find, start and follow a user's server, report SSH activity",
                "scopes": list(SERVICE_SCOPES),
                "services": [SERVICE_NAME]},),
        role_scopes={"user": (ACCESS_SCOPE,)},  # every user may open the key page
    )


def configure_ssh(c, settings) -> None:
    """The gateway's options besides its service and role (its `ssh_part`): its port and
    address, the per-server keys in the spawner, and its hand-over, written from the hub's
    final config (options set after hub_config count)."""
    state_dir = _state_dir(settings)
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    c.SSHGateway.port = settings.ssh_port  # a config file loaded later may still set another
    if settings.ssh_address:
        c.SSHGateway.address = settings.ssh_address
    write_when_config_loaded(state_dir / HAND_OVER,
                             lambda hub: render_hand_over(hub, state_dir, settings.directory), private=True)
    c.GPUDockerSpawner.ssh_state_dir = str(state_dir)
