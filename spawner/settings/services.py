"""The hub's services, roles and custom scopes, its pages' templates, the directory's role groups,
and what its servers get: built by one function, set once.

"Config should never append or mutate, only set" (the Littlest JupyterHub's configurer): each
part (the idle culler, the gpu-pool service and its jobs, the SSH gateway) says what it adds as
a `Part`, a value; `hub_services` combines the parts with what the config already holds
(services and roles of the admin's own, the `user` role's scopes), without changing any of it,
and `set_hub_services` sets each option once.  No part reads another's output, so the order in
which they are listed does not matter.
"""

from __future__ import annotations

from typing import Any

from traitlets.config import LazyConfigValue

from .culler import culler_part
from .part import Part
from .pool_jobs import jobs_part
from .pool_service import pool_part
from .ssh_service import ssh_part

USER_ROLE = "user"


def parts(c, settings) -> list[Part]:
    """The parts the settings turn on."""
    found = []
    if settings.cull:
        found.append(culler_part(settings))
    if settings.pool_page:
        bridge_ip = c.JupyterHub.hub_connect_ip if "hub_connect_ip" in c.JupyterHub else ""
        base_url = c.JupyterHub.base_url if "base_url" in c.JupyterHub else "/"
        found.append(pool_part(settings, bridge_ip, base_url))
        if settings.jobs:
            found.append(jobs_part(settings, bridge_ip))
    if settings.ssh:
        found.append(ssh_part(settings))
    return found


def _with(scopes, added) -> list[str]:
    """`scopes` then each of `added` not in it yet, as a new list."""
    out = list(scopes)
    out.extend(s for s in added if s not in out)
    return out


def _given(section, name: str, empty):
    """The config's own value of `name` (a copy), or `empty` when it has none."""
    if name not in section:
        return empty
    value = section[name]
    if isinstance(value, LazyConfigValue):  # e.g. c.GPUDockerSpawner.environment.update({...})
        return value.get_value(type(empty)())
    return type(empty)(value)


def hub_services(c, settings) -> dict[tuple[str, str], Any]:
    """{(section, option): value} for the hub's services, roles, custom scopes and the servers'
    environment and token scopes: the parts' additions over what `c` already holds.  `c` is
    only read; the values are new lists and dicts."""
    found = parts(c, settings)
    if not found:
        return {}
    ours = {s["name"] for p in found for s in p.services}
    our_roles = {r["name"] for p in found for r in p.roles}
    services = [dict(s) for s in _given(c.JupyterHub, "services", []) if s.get("name") not in ours]
    roles = [dict(r) for r in _given(c.JupyterHub, "load_roles", []) if r.get("name") not in our_roles]
    for part in found:
        services += [dict(s) for s in part.services]
        roles += [dict(r) for r in part.roles]

    role_scopes: dict[str, list[str]] = {}
    oauth_scopes: dict[str, list[str]] = {}
    custom = dict(_given(c.JupyterHub, "custom_scopes", {}))
    environment = dict(_given(c.GPUDockerSpawner, "environment", {}))
    token_scopes: list[str] = []
    paths = list(_given(c.JupyterHub, "template_paths", []))
    template_vars = dict(_given(c.JupyterHub, "template_vars", {}))
    role_groups = dict(_given(c.DirectoryAuthenticator, "role_groups", {}))
    for part in found:
        paths = [*(p for p in part.template_paths if p not in paths), *paths]
        template_vars.update(part.template_vars)
        role_groups.update(part.role_groups)
        for name, scopes in part.role_scopes.items():
            role_scopes[name] = _with(role_scopes.get(name, []), scopes)
        for name, scopes in part.oauth_scopes.items():
            oauth_scopes[name] = _with(oauth_scopes.get(name, []), scopes)
        custom.update(part.custom_scopes)
        environment.update(part.environment)
        token_scopes = _with(token_scopes, part.server_token_scopes)

    if USER_ROLE in role_scopes and not any(r.get("name") == USER_ROLE for r in roles):
        roles.append({"name": USER_ROLE, "scopes": ["self"]})  # JupyterHub's own `user` role
    roles = [{**r, "scopes": _with(r.get("scopes", []), role_scopes.get(r["name"], ()))} for r in roles]
    services = [{**s, "oauth_client_allowed_scopes": _with(s.get("oauth_client_allowed_scopes", []),
                                                            oauth_scopes[s["name"]])}
                if s.get("name") in oauth_scopes else s for s in services]

    values: dict[tuple[str, str], Any] = {("JupyterHub", "services"): services,
                                          ("JupyterHub", "load_roles"): roles}
    if custom:
        values["JupyterHub", "custom_scopes"] = custom
    if environment:
        values["GPUDockerSpawner", "environment"] = environment
    if token_scopes:
        values["GPUDockerSpawner", "server_token_scopes"] = token_scopes
    if any(p.template_paths for p in found):
        values["JupyterHub", "template_paths"] = paths
    if any(p.template_vars for p in found):
        values["JupyterHub", "template_vars"] = template_vars
    if any(p.role_groups for p in found):
        values["DirectoryAuthenticator", "role_groups"] = role_groups
    return values


def set_hub_services(c, settings) -> None:
    """Set each option of `hub_services` in `c`, once."""
    for (section, name), value in hub_services(c, settings).items():
        setattr(c[section], name, value)
