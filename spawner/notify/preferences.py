"""Each user's notification choices: for every event and channel, "auto", "always" or "never".

"auto" (the default) tells only what a person away from the tab would miss: a grant after
a wait of `AUTO_AFTER_S` or more, a job that ran that long.  A document is checked whole
(`parse`): anything unknown is refused with a message naming it, and nothing is changed.
"""

from __future__ import annotations

import json
from typing import Any

from ..pool.ledger.events import EVENTS, GRANTED, JOB_ENDED
from ..pool.ledger.outbox import CHANNELS

AUTO, ALWAYS, NEVER = "auto", "always", "never"
CHOICES = (AUTO, ALWAYS, NEVER)
AUTO_AFTER_S = 300.0  # "auto": the user waited, or the job ran, at least five minutes
DOCUMENT_MAX = 4096  # bytes of a PUT body


class BadPreferences(ValueError):
    """A document that is not a valid set of choices (the message says what and where)."""


def defaults() -> dict[str, dict[str, str]]:
    return {event: {channel: AUTO for channel in CHANNELS} for event in EVENTS}


def parse(raw: bytes | str) -> dict[str, dict[str, str]]:
    """The choices in a PUT body, `{"events": {event: {channel: choice}}}`; events and channels
    left out keep their default ("auto").  Raises BadPreferences."""
    if len(raw) > DOCUMENT_MAX:
        raise BadPreferences(f"the document is over {DOCUMENT_MAX} bytes")
    try:
        doc = json.loads(raw)
    except ValueError:
        raise BadPreferences('the body must be JSON: {"events": {"granted": {"email": "always"}}}') from None
    if not isinstance(doc, dict) or set(doc) - {"events"}:
        raise BadPreferences('the body must be an object with one key, "events"')
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
    return out


def stored(raw: str | None) -> dict[str, dict[str, str]]:
    """The choices as the ledger keeps them (None: the defaults); unknown entries are dropped."""
    out = defaults()
    try:
        doc = json.loads(raw) if raw else {}
    except ValueError:
        return out
    for event, channels in (doc.items() if isinstance(doc, dict) else ()):
        for channel, choice in (channels.items() if isinstance(channels, dict) else ()):
            if event in out and channel in out[event] and choice in CHOICES:
                out[event][channel] = choice
    return out


def wants(choices: dict[str, dict[str, str]], event: str, channel: str, payload: dict[str, Any]) -> bool:
    """Whether this event goes to this channel for a user with these choices."""
    choice = choices.get(event, {}).get(channel, AUTO)
    if choice != AUTO:
        return choice == ALWAYS
    if event == GRANTED:
        return float(payload.get("waited_s") or 0) >= AUTO_AFTER_S
    if event == JOB_ENDED:
        return float(payload.get("ran_s") or 0) >= AUTO_AFTER_S
    return False
