"""Each user's notification record in the ledger (gpu_pool_notify_users): choices and address.

The address is the directory's `mail` attribute, which reaches auth_state when the
authenticator lists it in `auth_state_attributes` (the directory login keeps it under
`user_attributes`); the spawner records it at each spawn, the job service at each submission.
A user without one gets no mail.  A user may set another address, confirmed by a link
(own_address.py): once confirmed it is where mail goes (`record`), the directory's stays the default.
"""

from __future__ import annotations

import re
import secrets
from typing import Any

from sqlalchemy import insert, select, update

from ..pool.ledger.schema import NAME_MAX, meta_table, notify_users_table
from . import own_address

# One address, as a directory holds it: no spaces, no CR/LF, one @, a dotted or plain domain.
_ADDRESS = re.compile(r"^[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+@[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?$")
SECRET_KEY = "notify_secret"


def address_of(auth_state: dict | None) -> str | None:
    """The `mail` attribute in auth_state (a list or a string), if it is one plain address."""
    attrs = (auth_state or {}).get("user_attributes") or {}
    value = attrs.get("mail") if isinstance(attrs, dict) else None
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    if not isinstance(value, str):
        return None
    value = value.strip()
    return value if len(value) <= NAME_MAX and _ADDRESS.match(value) else None


def _upsert(store, conn, user: str, **values: Any) -> None:
    t = notify_users_table.c
    now = store.now(conn)
    if conn.execute(update(notify_users_table).where(t.user_name == user).values(updated_at=now, **values)).rowcount:
        return
    conn.execute(insert(notify_users_table).values(user_name=user, updated_at=now, **values))


def record_address(pool, user: str, auth_state: dict | None) -> str | None:
    """Keep the directory's address for `user` (none: the one known is forgotten)."""
    address = address_of(auth_state)
    pool._store.write(lambda conn: _upsert(pool._store, conn, user, address=address), durable=False)
    return address


def set_preferences(pool, user: str, raw: str) -> None:
    """Store `user`'s choices (their confirmed or pending own address stays as it is)."""
    def write(conn):
        old, _ = stored_record(pool._store, conn, user)
        _upsert(pool._store, conn, user, preferences=own_address.carried(old, raw))
    pool._store.write(write)


def stored_record(store, conn, user: str) -> tuple[str | None, str | None]:
    """(preferences JSON or None, the directory's address or None), as kept."""
    t = notify_users_table.c
    row = conn.execute(select(t.preferences, t.address).where(t.user_name == user)).first()
    return (row.preferences, row.address) if row else (None, None)


def record(store, conn, user: str) -> tuple[str | None, str | None]:
    """(preferences JSON or None, the address mail goes to or None: a confirmed own address,
    else the directory's)."""
    raw, address = stored_record(store, conn, user)
    return raw, own_address.effective(raw, address)


def read(pool, user: str) -> tuple[str | None, str | None]:
    return pool._store.read(lambda conn: record(pool._store, conn, user))


def read_stored(pool, user: str) -> tuple[str | None, str | None]:
    return pool._store.read(lambda conn: stored_record(pool._store, conn, user))


def update_own_address(pool, user: str, change) -> str:
    """Apply `change(raw) -> new raw` to `user`'s record under the write lock; returns the new raw."""
    def write(conn):
        old, _ = stored_record(pool._store, conn, user)
        new = change(old)
        _upsert(pool._store, conn, user, preferences=new)
        return new
    return pool._store.write(write)


def secret(pool) -> bytes:
    """The key of the unsubscribe links, made once and kept in the ledger (every process that
    sends or checks links shares it, and it survives restarts)."""
    def get_or_make(conn):
        t = meta_table.c
        found = conn.execute(select(t.value).where(t.key == SECRET_KEY)).scalar()
        if found is None:
            found = secrets.token_hex(32)
            conn.execute(insert(meta_table).values(key=SECRET_KEY, value=found))
        return found
    return bytes.fromhex(pool._store.write(get_or_make))
