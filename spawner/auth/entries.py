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


def in_groups(wanted: list[str], auth_state: dict, names: dict[str, list[str]] | None = None) -> bool:
    """Whether auth_state's groups include one of `wanted` (names, or DNs: they hold '=').

    With `names` ({lower-case group name: the DNs of every directory group carrying it}),
    a name is matched by DN: it stands for its one group, and a name that no group or
    several groups carry matches nothing.  Privileged groups are decided this way, so a
    group someone made elsewhere in the directory under the same name grants nothing.
    """
    dns = {norm_dn(d) for d in auth_state.get("group_dns", [])}
    if names is not None:
        def dn_of(w: str) -> set[str]:
            carriers = names.get(w.lower()) or []
            return {norm_dn(carriers[0])} if len(carriers) == 1 else set()
        return any((norm_dn(w) in dns) if "=" in w else bool(dn_of(w) & dns) for w in wanted)
    group_names = {g.lower() for g in auth_state.get("groups", [])}
    return any(norm_dn(w) in dns if "=" in w else w.lower() in group_names for w in wanted)
