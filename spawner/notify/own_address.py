"""A user-set e-mail address, confirmed by a link (issue 39: "the address from the directory's
`mail` attribute or a user-set one confirmed by a link").

The directory's address stays the default and needs no confirmation.  A user who sets another one
(`POST api/notifications/address`) gets a mail at that address with a signed link that expires
(`EmailNotifications.confirm_max_age`, signing.confirm_url); mail goes to it only once the link is
opened and its button pressed (a GET shows the button, so a mail scanner fetching links confirms
nothing).  Until then, and after `DELETE api/notifications/address`, the directory's address is used.

Bounded: at most PENDING_MAX addresses wait for confirmation per user (a newer ask drops the
oldest), at most `EmailNotifications.confirmations_per_hour` confirmation mails per user in any
hour (a 429 names the limit), so the hub cannot be made to mail strangers.  A link confirms only
the address it names, for the user it names, while that address still waits (a newer ask for the
same address, or a removal, makes the older link void).

The state lives in the user's notification record (the preferences document's `own_address`
part, which `PUT api/notifications` cannot write): `{"confirmed": address-or-null, "pending":
[{"address", "expires"}], "asked": [unix seconds of the confirmation mails]}`.
"""

from __future__ import annotations

import html
import json
import re
from datetime import UTC, datetime
from email.message import EmailMessage
from email.utils import format_datetime, make_msgid
from typing import Any

from ..pool.ledger.schema import NAME_MAX
from . import preferences
from .message import POLICY, SUBJECT_PREFIX, header_safe

PART = "own_address"
PENDING_MAX = 3
HOUR = 3600.0
# One address, as directory.py checks the directory's: no spaces, no CR/LF, one @.
_ADDRESS = re.compile(r"^[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+@[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?$")


class BadAddress(ValueError):
    """Not one plain address (400)."""


class TooMany(ValueError):
    """Over the confirmation mails' hourly limit (429)."""


class NotPending(ValueError):
    """A link for an address that no longer waits for confirmation (409)."""


def checked(address: Any) -> str:
    if not isinstance(address, str):
        raise BadAddress('"address" must be an e-mail address (a string), e.g. "ada@example.org"')
    value = address.strip()
    if not value or len(value) > NAME_MAX or not _ADDRESS.match(value):
        raise BadAddress(f"{value[:80]!r} is not one plain e-mail address (name@domain, at most {NAME_MAX} "
                         "characters, no spaces or display name)")
    return value


def part(raw: str | None) -> dict:
    """The own-address part of a stored document, normalised (bad entries dropped)."""
    try:
        doc = json.loads(raw) if raw else {}
    except ValueError:
        doc = {}
    got = doc.get(PART) if isinstance(doc, dict) else None
    got = got if isinstance(got, dict) else {}
    confirmed = got.get("confirmed")
    pending = [p for p in got.get("pending") or [] if isinstance(p, dict) and isinstance(p.get("address"), str)
               and isinstance(p.get("expires"), (int, float))]
    asked = [t for t in got.get("asked") or [] if isinstance(t, (int, float))]
    return {"confirmed": confirmed if isinstance(confirmed, str) and confirmed else None,
            "pending": pending[-PENDING_MAX:], "asked": asked[-100:]}


def with_part(raw: str | None, own: dict) -> str:
    """`raw` (the user's stored document) with `own` as its own-address part."""
    doc = json.loads(preferences.dump(preferences.stored(raw), preferences.stored_webhook(raw)))
    doc[PART] = own
    return json.dumps(doc, sort_keys=True)


def carried(old: str | None, new: str) -> str:
    """`new` (a document of choices being stored) keeping `old`'s own-address part."""
    own = part(old)
    if own == part(None):
        return new
    return with_part(new, own)


def effective(raw: str | None, directory_address: str | None) -> str | None:
    """Where mail goes: the confirmed user-set address, else the directory's."""
    return part(raw)["confirmed"] or directory_address


def ask(raw: str | None, address: str, now: float, max_age: float, per_hour: int) -> tuple[str, int]:
    """Record a confirmation to send to `address`; returns (the new document, the link's expiry).
    Raises BadAddress, TooMany."""
    address = checked(address)
    own = part(raw)
    asked = [t for t in own["asked"] if now - t < HOUR]
    if len(asked) >= per_hour:
        again = datetime.fromtimestamp(min(asked) + HOUR, UTC).strftime("%H:%M UTC")
        raise TooMany(f"At most {per_hour} confirmation mails an hour (EmailNotifications.confirmations_per_hour); "
                      f"try again after {again}")
    expires = int(now + max_age)
    pending = [p for p in own["pending"] if p["expires"] > now and p["address"].lower() != address.lower()]
    pending = (pending + [{"address": address, "expires": expires}])[-PENDING_MAX:]
    return with_part(raw, {"confirmed": own["confirmed"], "pending": pending, "asked": asked + [now]}), expires


def confirm(raw: str | None, address: str, expires: int, now: float) -> str:
    """The document with `address` confirmed (the pending ones dropped).  Raises NotPending."""
    own = part(raw)
    if not any(p["address"] == address and int(p["expires"]) == int(expires) for p in own["pending"]):
        if own["confirmed"] == address:  # opened twice: already done
            return with_part(raw, own)
        raise NotPending(f"{address} no longer waits for confirmation: a newer mail was asked for, or the address "
                         "was removed. Set it again on the notification choices page.")
    return with_part(raw, {"confirmed": address, "pending": [], "asked": own["asked"]})


def clear(raw: str | None) -> str:
    """Back to the directory's address: the user-set one and the pending ones dropped (the count
    of confirmation mails of the last hour is kept: the limit still holds)."""
    own = part(raw)
    return with_part(raw, {"confirmed": None, "pending": [], "asked": own["asked"]})


def view(raw: str | None, directory_address: str | None, now: float) -> dict:
    """What the API says: where mail goes, the directory's address, the user-set one, the pending ones."""
    own = part(raw)
    return {"address": own["confirmed"] or directory_address, "directory": directory_address,
            "confirmed": own["confirmed"],
            "pending": [{"address": p["address"], "expires_at": datetime.fromtimestamp(p["expires"], UTC).isoformat()}
                        for p in own["pending"] if p["expires"] > now]}


def compose(user: str, address: str, link: str, sender: str, expires: int,
            domain: str = "gpu-hub.invalid") -> EmailMessage:
    """The confirmation mail: plain text and escaped HTML, headers no input can add to."""
    until = datetime.fromtimestamp(expires, UTC).strftime("%Y-%m-%d %H:%M UTC")
    text = (f"The GPU hub user {user} asked for their notifications to go to this address.\n\n"
            f"Open this link and press its button to confirm (valid until {until}):\n  {link}\n\n"
            "If you did not ask for this, ignore this mail: nothing is sent here without the confirmation.\n")
    page = (f"<p>The GPU hub user <b>{html.escape(user)}</b> asked for their notifications to go to this "
            f"address.</p><p><a href=\"{html.escape(link, quote=True)}\">Confirm this address</a> (valid until "
            f"{html.escape(until)}).</p><p>If you did not ask for this, ignore this mail: nothing is sent here "
            "without the confirmation.</p>")
    msg = EmailMessage(policy=POLICY)
    msg["Subject"] = header_safe(f"{SUBJECT_PREFIX}: confirm your address for notifications")
    msg["From"] = header_safe(sender, 320)
    msg["To"] = header_safe(address, 320)
    msg["Date"] = format_datetime(datetime.now(UTC))
    msg["Message-ID"] = make_msgid("gpu-confirm", domain=domain)
    msg["Auto-Submitted"] = "auto-generated"
    msg.set_content(text)
    msg.add_alternative(f"<!DOCTYPE html><html><body>{page}</body></html>", subtype="html")
    return msg
