"""The gpu-pool service in the hub's config: the service, its scopes and roles.

Called by apply_settings when GPUHUB_POOL_PAGE is on (the default).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from jupyterhub.utils import url_path_join

from ..inventory.machine import SimulatedInventory
from ..poolpage import ADMIN_SCOPE, EXEC_SCOPE, SERVICE_NAME
from ..poolpage.service_config import CONFIG_FILE_ENV, FILE_NAME
from ..services.hub_api import SERVICE_SCOPES
from ..services.lifecycle import write_when_config_loaded
from .part import Part

HUB_TEMPLATES = str(Path(__file__).parents[1] / "poolpage" / "hub_templates")
ADMIN_ROLE = "gpu-pool-admin"
EXEC_ROLE = "gpu-pool-exec"
SERVICE_ROLE = "gpu-pool-service"
ACCESS_SCOPE = f"access:services!service={SERVICE_NAME}"
# The hub groups the directory login fills by its DN decision (DirectoryAuthenticator.role_groups);
# the privileged roles go to these, never to a group named after a directory group's name.
ADMIN_GROUP = "gpu-pool:admin"
EXEC_GROUP = "gpu-pool:exec"
# JupyterHub's `server` role, plus asking the gpu-pool service (JupyterLab's GPU status, through
# images/jupyter/gpuhub_activity/lab.py); jobs add their own scope to it (settings/pool_jobs.py).
SERVER_TOKEN_SCOPES = ["users:activity!user", "access:servers!server", ACCESS_SCOPE]


def role_groups(settings) -> dict[str, list[str]]:
    """{hub group: directory groups} for the directory login: who is a pool admin, who runs scripts."""
    directory = getattr(settings, "directory", None)
    if directory is None:
        return {}
    return {group: list(wanted) for group, wanted in ((ADMIN_GROUP, directory.admin_groups),
                                                      (EXEC_GROUP, directory.exec_groups)) if wanted}


def set_page_settings(c, settings, bridge_ip: str) -> None:
    """c.PoolPageSettings from the GPUHUB_* settings: what the page shows and acts on."""
    from urllib.parse import urlparse

    page = c.PoolPageSettings
    page.show_holders = settings.pool_page_show_holders
    # The culler's deadlines and the servers' activity reports come from the hub's final config
    # (service_file.py), as the culler's own file does.
    # GPU utilisation, read as the culler reads it.
    page.inventory = settings.inventory
    page.simulated_gpus = SimulatedInventory(config=c).count
    page.utilization_file = settings.simulated_utilization_file or ""
    # The hub's proxy on this machine (action scripts go through it): its bind address, a
    # wildcard read as loopback; a self-signed certificate of the hub's own proxy is the usual case.
    bound = urlparse(settings.bind_url)
    host = bound.hostname or "127.0.0.1"
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    shown = f"[{host}]" if ":" in host else host
    port = bound.port or (443 if bound.scheme == "https" else 80)
    page.proxy_url = f"{bound.scheme}://{shown}:{port}"
    page.proxy_validate_cert = bound.scheme != "https"
    page.bridge_ip = bridge_ip


def pool_part(settings, bridge_ip: str, base_url: str = "/") -> Part:
    """The gpu-pool service, its admin and exec scopes, its roles, and what the servers need
    to ask it (services.py sets them).

    Every user may open the page (the `user` role gains the service's access
    scope); GPUHUB_ADMIN_USERS and the members of the directory's admin groups
    get `custom:gpu-pool:admin` (drain, undrain, end leases, everyone's usage);
    GPUHUB_POOL_EXEC_USERS and the members of the directory's exec groups get
    `custom:gpu-pool:exec` (action scripts in other people's servers).  Directory
    members get them through the hub groups the directory login fills by DN
    (ADMIN_GROUP, EXEC_GROUP).
    """
    # Its settings in one file the hub writes from its final config; the ledger's URL (a secret)
    # in its environment, as the CLI reads it.
    from ..pool import ENV_DB_URL

    path = settings.data_dir / FILE_NAME  # written at the hub's start (service_file.py)
    environment = {ENV_DB_URL: settings.pool_db_url, CONFIG_FILE_ENV: str(path),
                   **authenticator_environment(settings)}
    if os.environ.get("DOCKER_HOST"):  # the jobs reach the hub's Docker as the spawner does
        environment["DOCKER_HOST"] = os.environ["DOCKER_HOST"]
    service = {
        "name": SERVICE_NAME,
        "display": True,
        "oauth_no_confirm": True,
        "url": f"http://127.0.0.1:{settings.pool_page_port}",
        "command": [sys.executable, "-m", "spawner.poolpage"],
        "environment": environment,
        # OAuth tokens the page gets carry the admin scope when the user holds it.
        "oauth_client_allowed_scopes": [ADMIN_SCOPE, EXEC_SCOPE],
    }
    roles = (
        {"name": ADMIN_ROLE,
         "description": "Administer the GPU pool from its page and API",
         "scopes": [ADMIN_SCOPE, ACCESS_SCOPE],
         "users": list(settings.admin_users),
         "groups": [ADMIN_GROUP]},
        {"name": EXEC_ROLE,
         "description": "Run action scripts in other people's running servers",
         "scopes": [EXEC_SCOPE],
         "users": list(settings.pool_exec_users),
         "groups": [EXEC_GROUP]},
        # The service's own token: find running servers, see their activity and
        # profile, stop one (an admin ending a lease).
        {"name": SERVICE_ROLE,
         "description": "The GPU pool page: list running servers and stop one when a pool admin ends its lease"
                        + ("; it reads users' groups and directory identity to run their jobs"
                           if settings.jobs else ""),
         "scopes": list(SERVICE_SCOPES),
         "services": [SERVICE_NAME]},
    )
    custom = {
        ADMIN_SCOPE: {"description": "Drain and undrain GPUs, end leases, see every user's GPU usage "
                                     "on the GPU pool page"},
        EXEC_SCOPE: {"description": "Run action scripts in other people's running servers (as each "
                                    "server's own user) from the GPU pool page and `gpu-pool exec`"},
    }
    # What the notebook servers need to ask the service (their JupyterLab's GPU status): a token
    # that may, and where it listens for them (the hub's bridge address; on Swarm, the overlay's).
    # Without a bridge address (`gpu-pool --config` outside the hub) the servers get no URL.
    servers = {"GPUHUB_POOL_URL": service_url(settings, bridge_ip)} if bridge_ip else {}
    return Part(services=(service,), roles=roles, role_scopes={"user": (ACCESS_SCOPE,)},
                custom_scopes=custom, environment=servers, server_token_scopes=tuple(SERVER_TOKEN_SCOPES),
                # A "GPU pool" link in the hub's navigation bar (hub_templates/page.html).
                template_paths=(HUB_TEMPLATES,),
                template_vars={"gpu_pool_url": url_path_join(base_url, "services", SERVICE_NAME) + "/"},
                # The directory's admin and exec groups, for the hub groups the roles name.
                role_groups=role_groups(settings))


def service_url(settings, bridge_ip: str) -> str:
    """Where the notebook servers reach the gpu-pool service."""
    return f"http://{bridge_ip}:{settings.pool_page_port}/services/{SERVICE_NAME}/"


def configure_pool_page(c, settings) -> None:
    """The gpu-pool service's options besides its `pool_part` (services, roles, the hub's
    navigation link, the directory's role groups): the page's settings and the authenticator's
    file the hub writes for it at its start."""
    bridge_ip = c.JupyterHub.hub_connect_ip if "hub_connect_ip" in c.JupyterHub else ""
    set_page_settings(c, settings, bridge_ip)
    hand_authenticator_over(settings)


def _authenticator_file(settings):
    return settings.data_dir / "gpu-pool-auth" / "authenticator.json"


def authenticator_environment(settings) -> dict[str, str]:
    """The service's variables for the hub's authenticator: the path of the file
    `hand_authenticator_over` writes, and the directory's lookup password when it was given
    inline (never in the file)."""
    from ..reauth import AUTHENTICATOR_FILE_ENV
    from ..ssh.gateway_settings import INLINE_SECRET_ENV

    environment = {AUTHENTICATOR_FILE_ENV: str(_authenticator_file(settings))}
    directory = getattr(settings, "directory", None)
    if directory is not None and directory.bind_password and not directory.bind_password_file:
        environment[INLINE_SECRET_ENV] = directory.bind_password
    return environment


def hand_authenticator_over(settings) -> None:
    """The hub's authenticator for the service, which asks an admin's password again before an
    action script runs (reauth.py): its class and settings in a file the hub writes from its
    final config, readable by the hub's user only, never the directory's lookup password (the
    path of its file, or the variable `authenticator_environment` gives the service)."""
    import json

    from ..ssh.gateway_settings import _jsonable, authenticator_hand_over

    path = _authenticator_file(settings)
    state_dir = path.parent
    directory = getattr(settings, "directory", None)

    def render(hub) -> str:  # in the hub only (not in `gpu-pool --config`, which may not write here)
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        handed = authenticator_hand_over(hub, state_dir, directory, reader="The gpu-pool service")
        return json.dumps(handed, default=_jsonable)

    write_when_config_loaded(path, render, private=True)
