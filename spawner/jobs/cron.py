"""Cron strings for schedules: what is accepted, how often it fires, when it fires next.

Pure: the clock is always passed in (times are aware UTC datetimes; cron is read in UTC).
A schedule fires at most once per look, however many of its slots passed meanwhile
(`next_firing`): a service that was down for a night runs a nightly schedule once when it
comes back, not once per missed slot.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from croniter import croniter

# Five fields (minute hour day-of-month month day-of-week) or one of croniter's @-names
# that stand for them; no seconds field, no @reboot (there is no "boot" of a schedule).
NICKNAMES = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
MAX_CRON = 128
EXAMPLE = "0 3 * * *"
# How many firings ahead the shortest interval is measured over.
LOOKAHEAD = 200


class BadCron(ValueError):
    """A cron string refused; str() is the message for the user (HTTP 400)."""


def _utc(moment: datetime) -> datetime:
    if moment.tzinfo is None:
        raise ValueError("cron times are aware datetimes")
    return moment.astimezone(UTC)


def next_times(cron: str, after: datetime, count: int = 3) -> list[datetime]:
    """The next `count` firings of a valid `cron` strictly after `after`."""
    it = croniter(cron, _utc(after))
    return [it.get_next(datetime).astimezone(UTC) for _ in range(count)]


def _shown(times: list[datetime]) -> str:
    texts = [t.strftime("%Y-%m-%d %H:%M UTC") for t in times]
    return ", ".join(texts[:-1]) + " and " + texts[-1]


def example_hint(now: datetime) -> str:
    """What a good cron string looks like, with the next three times it would fire."""
    return (f"A schedule takes five fields, minute hour day-of-month month day-of-week, in UTC: "
            f"e.g. '{EXAMPLE}' (every day at 03:00) would fire at {_shown(next_times(EXAMPLE, now))}")


def check_cron(value, now: datetime) -> str:
    """The cron string, normalised (single spaces), or BadCron with a message that shows an example."""
    if not isinstance(value, str) or not value.strip():
        raise BadCron(f"'cron' is required. {example_hint(now)}")
    if len(value) > MAX_CRON or any(ord(ch) < 32 and ch not in "\t" for ch in value):
        raise BadCron(f"'cron' is longer than {MAX_CRON} characters or holds control characters. "
                      f"{example_hint(now)}")
    cron = " ".join(value.split())
    fields = cron.split(" ")
    nickname = len(fields) == 1 and cron.lower() in NICKNAMES
    if not nickname and len(fields) != 5:
        shown = "".join(ch for ch in cron[:40] if ch.isprintable())
        raise BadCron(f"'cron' must have five fields, not {len(fields)} ({shown!r}). {example_hint(now)}")
    try:
        valid = croniter.is_valid(cron)
        if valid:
            next_times(cron, now, 1)  # a valid-looking string that never fires (Feb 30) fails here
    except Exception:
        valid = False
    if not valid:
        shown = "".join(ch for ch in cron[:40] if ch.isprintable())
        raise BadCron(f"'cron' {shown!r} is not a cron string this hub understands. {example_hint(now)}")
    return cron


def shortest_interval(cron: str, now: datetime, lookahead: int = LOOKAHEAD) -> timedelta:
    """The shortest gap between two of the next `lookahead` + 1 firings of a valid `cron`."""
    times = next_times(cron, now, lookahead + 1)
    return min(b - a for a, b in zip(times, times[1:]))


def next_firing(cron: str, due_at: datetime, now: datetime) -> tuple[bool, datetime]:
    """(fire now?, the next time to look) for a schedule due at `due_at`, looked at `now`.

    Due (`due_at` <= now): it fires once, and its next time is cron's first slot after
    `now`, so every slot missed while nobody looked is skipped, not run one by one.
    Not yet due: nothing fires and `due_at` stands."""
    if _utc(due_at) > _utc(now):
        return False, due_at
    return True, next_times(cron, now, 1)[0]
