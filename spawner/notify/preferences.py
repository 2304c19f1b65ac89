"""Each user's notification choices: for every event and channel, "auto", "always" or "never",
and the user's webhook URL (none by default).

"auto" (the default) tells by e-mail and webhook only what a person away from the tab would
miss: a server ready after a wait of `Notifications.ready_after` seconds or more, a job that ran
`AUTO_AFTER_S` or more, and every other event (cull warnings, reclaims of borrowed GPUs, GPU-hour
budgets at 80 % and 100 %, bookings).  In the browser (a notification while a pool page is open,
which costs nothing) "auto" tells every event.  A document is checked whole (`parse`): anything
unknown is refused with a message naming it, and nothing is changed.  The ledger keeps
`{"events": {...}, "webhook": url-or-null}` (a document of the first slice, the events alone, is
read as such).
"""

from __future__ import annotations

import json
from typing import Any

from ..pool.ledger.events import EVENTS, GRANTED, JOB_ENDED
from ..pool.ledger.outbox import BROWSER, CHANNELS

AUTO, ALWAYS, NEVER = "auto", "always", "never"
CHOICES = (AUTO, ALWAYS, NEVER)
AUTO_AFTER_S = 300.0  # "auto": the job ran at least five minutes
DOCUMENT_MAX = 4096  # bytes of a PUT body
KEEP = object()  # a PUT without "webhook": the URL set before stays


class BadPreferences(ValueError):
    """A document that is not a valid set of choices (the message says what and where)."""


def defaults() -> dict[str, dict[str, str]]:
    return {event: {channel: AUTO for channel in CHANNELS} for event in EVENTS}


def parse(raw: bytes | str) -> dict[str, dict[str, str]]:
    """The choices in a PUT body, `{"events": {event: {channel: choice}}}`; events and channels
    left out keep their default ("auto").  Raises BadPreferences."""
    return parse_document(raw)[0]


def parse_document(raw: bytes | str) -> tuple[dict[str, dict[str, str]], Any]:
    """(the choices, the webhook URL as given: a string, None to remove it, or KEEP when the
    body does not name one).  The URL is checked against the allow-list by the caller."""
    if len(raw) > DOCUMENT_MAX:
        raise BadPreferences(f"the document is over {DOCUMENT_MAX} bytes")
    try:
        doc = json.loads(raw)
    except ValueError:
        raise BadPreferences('the body must be JSON: {"events": {"granted": {"email": "always"}}}') from None
    if not isinstance(doc, dict) or set(doc) - {"events", "webhook"}:
        raise BadPreferences('the body must be an object with the keys "events" and (optional) "webhook"')
    webhook = doc.get("webhook", KEEP)
    if webhook is not KEEP and webhook is not None and not isinstance(webhook, str):
        raise BadPreferences('"webhook" must be a URL (a string), or null to remove it')
    if webhook == "":
        webhook = None
    events = doc.get("events", {})
    if not isinstance(events, dict):
        raise BadPreferences('"events" must be an object of event name -> {channel: choice}')
    out = defaults()
    for event, channels in events.items():
        if event not in EVENTS:
            raise BadPreferences(f"unknown event {event!r}; the events are {', '.join(EVENTS)}")
        if not isinstance(channels, dict):
            raise BadPreferences(f"events.{event} must be an object of channel -> choice")
        for channel, choice in channels.items():
            if channel not in CHANNELS:
                raise BadPreferences(f"unknown channel {channel!r} in events.{event}; the channels are "
                                     f"{', '.join(CHANNELS)}")
            if choice not in CHOICES:
                raise BadPreferences(f"events.{event}.{channel} must be one of {', '.join(CHOICES)}, "
                                     f"not {choice!r}"[:300])
            out[event][channel] = choice
    return out, webhook


def _document(raw: str | None) -> dict:
    try:
        doc = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    if not isinstance(doc, dict):
        return {}
    return doc if "events" in doc else {"events": doc}  # the first slice kept the events alone


def stored(raw: str | None) -> dict[str, dict[str, str]]:
    """The choices as the ledger keeps them (None: the defaults); unknown entries are dropped."""
    out = defaults()
    doc = _document(raw).get("events")
    for event, channels in (doc.items() if isinstance(doc, dict) else ()):
        for channel, choice in (channels.items() if isinstance(channels, dict) else ()):
            if event in out and channel in out[event] and choice in CHOICES:
                out[event][channel] = choice
    return out


def stored_webhook(raw: str | None) -> str | None:
    """The webhook URL the ledger keeps for the user (None: none)."""
    url = _document(raw).get("webhook")
    return url if isinstance(url, str) and url else None


def dump(choices: dict[str, dict[str, str]], webhook: str | None) -> str:
    """The document the ledger keeps (directory.set_preferences)."""
    return json.dumps({"events": choices, "webhook": webhook}, sort_keys=True)


def wants(choices: dict[str, dict[str, str]], event: str, channel: str, payload: dict[str, Any],
          ready_after: float) -> bool:
    """Whether this event goes to this channel for a user with these choices (`ready_after`:
    Notifications.ready_after, the wait after which "auto" tells a server ready)."""
    choice = choices.get(event, {}).get(channel, AUTO)
    if choice != AUTO:
        return choice == ALWAYS
    if channel == BROWSER:
        return True  # the user has a pool page open and allowed its notifications
    if event == GRANTED:
        return float(payload.get("waited_s") or 0) >= ready_after
    if event == JOB_ENDED:
        return float(payload.get("ran_s") or 0) >= AUTO_AFTER_S
    # The warnings and bookings: each is news a person away from the tab can act on (keep the
    # server, save their work, plan their hours, come to their booked GPUs).
    return True
