"""Checks of what callers hand the pool: names, counts, groups, reasons, times.

Every public method validates its input here first, so a bad value becomes an
InvalidRequest with a message for the user, never a database error.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, overload

from .ledger.schema import NAME_MAX
from .models import EndReason, InvalidRequest


@dataclass(frozen=True)
class Request:
    """A validated request for GPUs."""

    user: str
    server_name: str
    count: int
    groups: tuple[str, ...]
    hosts: tuple[str, ...] | None
    # A cluster (gang): `workers` leases of `count` GPUs each, granted together or not at all.
    workers: int = 1
    # Seconds the leases are held at most (a batch job's timeout): GPUs booked for someone else
    # before that are not lent to it, as nothing stops it at the booking's start.
    holds_for: float | None = None
    # May go beyond the user's share on idle GPUs (a borrowed lease, reclaimed with notice).
    borrow: bool = False
    # When the request first joined the queue (a reclaimed job queued again keeps its place);
    # None: now.
    since: datetime | None = None

    @property
    def total(self) -> int:
        """Every GPU the request holds once granted (what quotas count)."""
        return self.count * self.workers


# What a caller may name as the request's host: one, several, or None (the default).
HostChoice = str | list[str] | tuple[str, ...] | None


def make_request(user, server_name, count, groups, host: HostChoice, default_host: str | None,
                 workers: int = 1) -> Request:
    """`host` (one name, or a list of names) restricts the request to those hosts; by
    default the inventory's host, or any.  `workers` > 1 asks for a gang (see Request)."""
    hosts = None
    if isinstance(host, (list, tuple)):
        hosts = tuple(name(h, "The host name") for h in host)
    elif host is not None:
        hosts = (name(host, "The host name"),)
    elif default_host is not None:
        hosts = (default_host,)
    return Request(
        user=name(user, "The user name"),
        server_name=name(server_name, "The server name", allow_empty=True),
        count=gpu_count(count),
        groups=groups_of(groups),
        hosts=hosts,
        workers=worker_count(workers),
    )


def name(value: Any, what: str, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise InvalidRequest(f"{what} must be a string, not {type(value).__name__}")
    if not value and not allow_empty:
        raise InvalidRequest(f"{what} must not be empty")
    if len(value) > NAME_MAX:
        raise InvalidRequest(f"{what} is longer than {NAME_MAX} characters")
    if any(ord(ch) < 32 for ch in value):
        raise InvalidRequest(f"{what} contains control characters")
    return value


def gpu_count(count: Any) -> int:
    if isinstance(count, bool) or not isinstance(count, int):
        raise InvalidRequest(f"The number of GPUs must be a whole number, not {count!r}")
    if count <= 0:
        raise InvalidRequest(f"The number of GPUs must be at least 1, not {count}")
    return count


# The most leases one gang request may ask for: a bound on one grant's writes, whatever the
# callers allow (the jobs' own maximum, JobLimits.max_workers, is far below it).
MAX_WORKERS = 256


def worker_count(workers: Any) -> int:
    if isinstance(workers, bool) or not isinstance(workers, int):
        raise InvalidRequest(f"The number of workers must be a whole number, not {workers!r}")
    if not 1 <= workers <= MAX_WORKERS:
        raise InvalidRequest(f"The number of workers must be between 1 and {MAX_WORKERS}, not {workers}")
    return workers


def worker_server_name(server_name: str, index: int) -> str:
    """The server name of worker `index`'s lease in a gang (worker 0 is the chief).

    One lease per worker, so accounting has one line per worker, each naming its cluster."""
    return f"{server_name}/worker-{index}"


def groups_of(groups: Any) -> tuple[str, ...]:
    if groups is None:
        return ()
    if isinstance(groups, str):
        raise InvalidRequest("groups must be a list of group names, not one string")
    try:
        items = list(groups)
    except TypeError:
        raise InvalidRequest("groups must be a list of group names") from None
    return tuple(sorted({name(g, "A group name") for g in items}))


# The largest id a row of the ledger can have (both databases' 64-bit integer keys).
MAX_ID = 2**63 - 1


def lease_id(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"A lease id is a whole number, not {value!r}")
    return value


def storable_id(value: int) -> bool:
    """Whether a row can have this id: one past 64 bits names nothing (and SQLite's driver
    raises OverflowError on it rather than finding nothing)."""
    return 0 <= value <= MAX_ID


def reason(value: EndReason | str) -> str:
    try:
        return EndReason(value).value
    except ValueError:
        choices = ", ".join(r.value for r in EndReason)
        raise InvalidRequest(f"Unknown end reason {value!r}; use one of {choices}") from None


@overload
def aware(value: datetime, what: str) -> datetime: ...
@overload
def aware(value: datetime | None, what: str) -> datetime | None: ...
def aware(value: datetime | None, what: str) -> datetime | None:
    """Naive datetimes are taken as UTC."""
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise InvalidRequest(f"{what} must be a datetime, not {value!r}")
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


# The times a caller may name (a period's ends, a booking's window): far inside the calendar, so
# that no period, default or hour drawn from them leaves it (a 500 with OverflowError before).
FIRST_TIME = datetime(1900, 1, 1, tzinfo=UTC)
LAST_TIME = datetime(9000, 1, 1, tzinfo=UTC)


class TimeOutOfRange(ValueError):
    """An ISO 8601 time that parses but lies outside [FIRST_TIME, LAST_TIME)."""


def iso_time(text: str) -> datetime:
    """An ISO 8601 date or date-and-time, UTC unless it names a zone; ValueError when it is not
    one, TimeOutOfRange (a ValueError) when it lies outside [FIRST_TIME, LAST_TIME)."""
    value = datetime.fromisoformat(text.strip())
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    try:
        utc = value.astimezone(UTC)  # an offset at the calendar's edge leaves it here
    except OverflowError:
        raise TimeOutOfRange(text) from None
    if not FIRST_TIME <= utc < LAST_TIME:
        raise TimeOutOfRange(text)
    return value


def holds_for(value) -> float | None:
    """How long a request will hold its GPUs at most (None: unknown, stopped when needed)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise InvalidRequest(f"holds_for must be a number of seconds >= 0, not {value!r}")
    return float(value)
