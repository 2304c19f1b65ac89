"""Values read out of directory entries: one attribute as text or a number, DNs compared.

Pure functions over what ldap3 returns, shared by the login flow, the directory
kinds' account checks and the group checks; no connection, no settings.
"""

from __future__ import annotations


def first(attrs: dict, name: str) -> str | None:
    """The first value of attribute `name` as text, or None."""
    value = attrs.get(name)
    if isinstance(value, list):
        value = value[0] if value else None
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return None if value is None else str(value)


def int_or_none(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def norm_dn(dn: str) -> str:
    # Enough for comparing DNs a directory returned with DNs an admin typed.
    return ",".join(part.strip() for part in dn.split(",")).lower()


def in_groups(wanted: list[str], auth_state: dict) -> bool:
    """Whether auth_state's groups include one of `wanted` (names, or DNs: they hold '=')."""
    names = {g.lower() for g in auth_state.get("groups", [])}
    dns = {norm_dn(d) for d in auth_state.get("group_dns", [])}
    return any(norm_dn(w) in dns if "=" in w else w.lower() in names for w in wanted)
