"""Whether a hub user still holds access to their own server, by the hub's roles.

The browser reaches a server only with the scope `access:servers` for it, which the hub
checks on every request.  The SSH gateway relays to the server's sshd directly, so it checks
the same grant itself at every login: the roles the hub's REST API lists for the user (and
their groups' roles) against what those roles hold.  What the roles hold comes from the
hub's config (JupyterHub's default roles, `c.JupyterHub.load_roles` over them), written
into the gateway's hand-over by the hub (rules_from_roles); JupyterHub assigns roles only
from that config, and a user in `Authenticator.blocked_users` is stripped of every role
when the hub starts.
"""

from __future__ import annotations

from collections.abc import Iterable

# Own-server access, as a grant's filter: "" (every server), "own" (the holder's own),
# "user=NAME", "server=NAME/", "group=GROUP".
OWN = "own"


def _implies_server_access(scope_name: str) -> bool:
    """Whether `scope_name` (no filter) is access:servers or holds it among its subscopes."""
    if scope_name == "self":  # a user's metascope: their own servers among the rest
        return True
    try:
        from jupyterhub.scopes import scope_definitions
    except ImportError:  # pragma: no cover (the hub's package is always there)
        return scope_name == "access:servers"
    seen: set[str] = set()
    frontier = [scope_name]
    while frontier:
        name = frontier.pop()
        if name == "access:servers":
            return True
        if name in seen:
            continue
        seen.add(name)
        frontier.extend(scope_definitions.get(name, {}).get("subscopes", ()))
    return False


def _grant(scope: str) -> str | None:
    name, _, filter_ = scope.partition("!")
    if not _implies_server_access(name):
        return None
    if name == "self" or filter_ in ("user", "server"):
        return OWN
    return filter_  # "", "user=NAME", "server=NAME/...", "group=GROUP"


def rules_from_roles(load_roles: Iterable[dict]) -> dict:
    """{"roles": {role: [grant, ...]}, "groups": {group: [role, ...]}} from JupyterHub's
    default roles and `load_roles` (a role of the same name replaces a default's scopes)."""
    from jupyterhub.roles import get_default_roles

    scopes = {r["name"]: list(r.get("scopes") or ()) for r in get_default_roles()}
    groups: dict[str, list[str]] = {}
    for role in load_roles or ():
        name = role.get("name")
        if not name:
            continue
        if "scopes" in role or name not in scopes:
            scopes[name] = list(role.get("scopes") or ())
        for group in role.get("groups") or ():
            groups.setdefault(group, []).append(name)
    grants = {name: sorted({g for g in map(_grant, held) if g is not None}) for name, held in scopes.items()}
    return {"roles": {name: g for name, g in grants.items() if g}, "groups": groups}


def reaches_own_server(rules: dict, user: dict) -> bool:
    """Whether the hub's user model `user` (GET /users/NAME: name, roles, groups) holds
    access to the user's own default server under `rules` (rules_from_roles)."""
    name = user.get("name", "")
    groups = set(user.get("groups") or ())
    held = set(user.get("roles") or ())
    for group in groups:
        held.update(rules.get("groups", {}).get(group, ()))
    for role in held:
        for grant in rules.get("roles", {}).get(role, ()):
            if grant in ("", OWN) or grant == f"user={name}" or grant == f"server={name}/":
                return True
            if grant.startswith("group=") and grant[len("group="):] in groups:
                return True
    return False
