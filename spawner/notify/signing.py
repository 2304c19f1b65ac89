"""One-click unsubscribe links: a signature over (user, event), so a link stops that one event
for that one user and cannot be altered into another's."""

from __future__ import annotations

import base64
import hashlib
import hmac
from urllib.parse import urlencode

from jupyterhub.utils import url_path_join

UNSUBSCRIBE_PATH = "notifications/unsubscribe"


def token(key: bytes, user: str, event: str) -> str:
    digest = hmac.new(key, f"unsubscribe\0{user}\0{event}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest[:24]).decode().rstrip("=")


def valid(key: bytes, user: str, event: str, given: str) -> bool:
    return hmac.compare_digest(token(key, user, event), given or "")


def unsubscribe_url(key: bytes, public_url: str, prefix: str, user: str, event: str) -> str:
    query = urlencode({"user": user, "event": event, "token": token(key, user, event)})
    return url_path_join(public_url.rstrip("/") + prefix, UNSUBSCRIBE_PATH) + "?" + query
