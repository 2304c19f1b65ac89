"""Who a user's container runs as: the directory's uid/gid, never root.

Servers (every engine) and batch jobs run as this identity; a directory
identity that would run as root is refused, never remapped.
"""

from __future__ import annotations

from tornado import web


class IdentityRefused(web.HTTPError):
    """The directory identity cannot be used for a container (uid 0, gid 0, malformed)."""

    def __init__(self, message: str):
        super().__init__(403, message)


def container_identity(auth_state: dict | None, fallback_uid: int, fallback_gid: int) -> tuple[int, int]:
    """uid, gid from the directory (auth_state) when it has them, else the fallback.

    A directory identity that would run as root (uid or gid 0) or that is
    malformed is refused, never remapped: a silent fallback would hand the
    user's files to another uid.  Servers and jobs both run as this."""
    auth_state = auth_state or {}
    uid = auth_state.get("uid_number")
    gid = auth_state.get("gid_number")
    for what, value in (("uidNumber", uid), ("gidNumber", gid)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise IdentityRefused(
                f"Your directory account has {what} {value!r}, which this hub will not run a "
                "server as (never root, never root's group). Ask your directory administrator "
                "to give you a regular one.")
    return (uid if uid is not None else fallback_uid, gid if gid is not None else fallback_gid)
