"""Signed links in the notifications: one-click unsubscribe, a signature over (user, event), so a
link stops that one event for that one user and cannot be altered into another's; and a cull
warning's "keep it", a signature over (user, server, expiry), so a link keeps only that user's
server, only until it expires; and the confirmation of a user-set address, a signature over
(user, address, expiry), so a link confirms only that address for that user, only until it expires."""

from __future__ import annotations

import base64
import hashlib
import hmac
from urllib.parse import urlencode

from jupyterhub.utils import url_path_join

UNSUBSCRIBE_PATH = "notifications/unsubscribe"
KEEP_PATH = "notifications/keep"
CONFIRM_PATH = "notifications/confirm"


def _mac(key: bytes, *parts: str) -> str:
    digest = hmac.new(key, "\0".join(parts).encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest[:24]).decode().rstrip("=")


def token(key: bytes, user: str, event: str) -> str:
    return _mac(key, "unsubscribe", user, event)


def valid(key: bytes, user: str, event: str, given: str) -> bool:
    return hmac.compare_digest(token(key, user, event), given or "")


def unsubscribe_url(key: bytes, public_url: str, prefix: str, user: str, event: str) -> str:
    query = urlencode({"user": user, "event": event, "token": token(key, user, event)})
    return url_path_join(public_url.rstrip("/") + prefix, UNSUBSCRIBE_PATH) + "?" + query


def _expiring_token(key: bytes, purpose: str, user: str, subject: str, expires: int) -> str:
    return _mac(key, purpose, user, subject, str(int(expires)))


def _expiring_url(key: bytes, public_url: str, prefix: str, path: str, purpose: str, user: str,
                  field: str, subject: str, expires: int) -> str:
    """A link for `user` about `subject` (its query field `field`), signed for `purpose` and valid
    until `expires` (Unix seconds)."""
    query = urlencode({"user": user, field: subject, "expires": int(expires),
                       "token": _expiring_token(key, purpose, user, subject, expires)})
    return url_path_join(public_url.rstrip("/") + prefix, path) + "?" + query


def keep_token(key: bytes, user: str, server: str, expires: int) -> str:
    return _expiring_token(key, "keep", user, server, expires)


def keep_valid(key: bytes, user: str, server: str, expires: int, given: str) -> bool:
    return hmac.compare_digest(keep_token(key, user, server, expires), given or "")


def keep_url(key: bytes, public_url: str, prefix: str, user: str, server: str, expires: int) -> str:
    """The "keep it" link of a cull warning: valid until `expires` (Unix seconds)."""
    return _expiring_url(key, public_url, prefix, KEEP_PATH, "keep", user, "server", server, expires)


def confirm_token(key: bytes, user: str, address: str, expires: int) -> str:
    return _expiring_token(key, "confirm", user, address, expires)


def confirm_valid(key: bytes, user: str, address: str, expires: int, given: str) -> bool:
    return hmac.compare_digest(confirm_token(key, user, address, expires), given or "")


def confirm_url(key: bytes, public_url: str, prefix: str, user: str, address: str, expires: int) -> str:
    """The link in the mail to a user-set address: valid until `expires` (Unix seconds)."""
    return _expiring_url(key, public_url, prefix, CONFIRM_PATH, "confirm", user, "address", address, expires)
