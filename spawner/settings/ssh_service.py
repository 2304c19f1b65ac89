"""The gpu-ssh service in the hub's config: the service, its role, the spawner's part.

Called by apply_settings when GPUHUB_SSH is on (off by default: it opens a port).
"""

from __future__ import annotations

import sys

from ..hub_service import without_named, write_when_config_loaded
from ..ssh import SERVICE_NAME
from ..ssh.hub_client import SERVICE_SCOPES
from ..ssh.settings import FILE_ENV_NAME, INLINE_SECRET_ENV, render_hand_over

SERVICE_ROLE = "gpu-ssh-service"
ACCESS_SCOPE = f"access:services!service={SERVICE_NAME}"


def configure_ssh(c, settings) -> None:
    """Add the gpu-ssh service (gateway + key page) and its role to a hub config `c`; turn on
    the per-server keys in the spawner.  Safe to call twice."""
    section = c.JupyterHub
    state_dir = settings.data_dir / "ssh"
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    hand_over = state_dir / "gateway.json"
    c.SSHGateway.port = settings.ssh_port  # a config file loaded later may still set another
    if settings.ssh_address:
        c.SSHGateway.address = settings.ssh_address
    # Written from the hub's final config (options set after hub_config count); it holds the
    # authenticator's settings but never the directory's lookup password: the path of the file
    # it came from (GPUHUB_DIRECTORY_BIND_PASSWORD_FILE), or the name of the service's variable
    # that carries it (GPUHUB_DIRECTORY_BIND_PASSWORD given inline), in its place.
    directory = settings.directory
    environment = {FILE_ENV_NAME: str(hand_over)}
    if directory is not None and directory.bind_password and not directory.bind_password_file:
        environment[INLINE_SECRET_ENV] = directory.bind_password
    write_when_config_loaded(hand_over, lambda hub: render_hand_over(hub, state_dir, directory), private=True)
    c.GPUDockerSpawner.ssh_state_dir = str(state_dir)
    services = section.services if "services" in section else []
    section.services = without_named(services, SERVICE_NAME) + [{
        "name": SERVICE_NAME,
        "display": True,
        "oauth_no_confirm": True,
        "url": f"http://127.0.0.1:{settings.ssh_page_port}",
        "command": [sys.executable, "-m", "spawner.ssh"],
        "environment": environment,
    }]
    roles = section.load_roles if "load_roles" in section else []
    roles = without_named(roles, SERVICE_ROLE) + [{
        "name": SERVICE_ROLE,
        "description": "The SSH gateway: find, start and follow a user's server, report SSH activity",
        "scopes": list(SERVICE_SCOPES),
        "services": [SERVICE_NAME],
    }]
    # Every user may open the key page.
    user_role = next((r for r in roles if r.get("name") == "user"), None)
    scopes = list(user_role["scopes"]) if user_role else ["self"]
    if ACCESS_SCOPE not in scopes:
        scopes.append(ACCESS_SCOPE)
    roles = without_named(roles, "user") + [{**(user_role or {"name": "user"}), "scopes": scopes}]
    section.load_roles = roles
