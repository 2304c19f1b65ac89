"""What one part of the deployment (the culler, the gpu-pool service, its jobs, the SSH gateway)
adds to the hub's services, roles and scopes and to its servers: a value, combined by services.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Part:
    """What one part adds to the hub's config: whole services and roles, scopes it adds to
    others' roles and services (by name), custom scopes, and the servers' environment and
    token scopes."""

    services: tuple[dict, ...] = ()
    roles: tuple[dict, ...] = ()
    # {role name: scopes}: added to a role of this or another part, or of the config (`user`).
    role_scopes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # {service name: scopes}: added to that service's `oauth_client_allowed_scopes`.
    oauth_scopes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    custom_scopes: dict[str, dict] = field(default_factory=dict)
    # c.GPUDockerSpawner.environment: a value, or a callable JupyterHub calls with the spawner
    environment: dict[str, Any] = field(default_factory=dict)
    server_token_scopes: tuple[str, ...] = ()  # c.GPUDockerSpawner.server_token_scopes
    template_paths: tuple[str, ...] = ()  # c.JupyterHub.template_paths, before the config's own
    template_vars: dict[str, str] = field(default_factory=dict)  # c.JupyterHub.template_vars
    role_groups: dict[str, list[str]] = field(default_factory=dict)  # c.DirectoryAuthenticator.role_groups
