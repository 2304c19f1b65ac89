"""The fair use of the pool, as methods of the GPUPool facade (a mixin): GPU-hour budgets,
bookings, and the fair-share standings.

Validation here, SQL in budget.py, bookings.py and history/rollup.py; the facade supplies the store,
its options (traits), its log and its wake-ups.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .. import validation
from ..history import rollup
from ..leasing import serving_order
from ..ledger.part import PoolPart
from ..models import InvalidRequest
from . import bookings, budget
from .bookings import Booking

if TYPE_CHECKING:
    pass


class PoolFairUse(PoolPart):
    """GPUPool's budgets, bookings and fair-share standings (see the module docstring)."""

    # Supplied by the GPUPool facade besides PoolPart's (declared for the type checker only).
    inventory: Any
    gpu_hour_budget: float | None
    group_gpu_hour_budgets: dict
    budget_period: float
    booking_max_hours: float
    booking_max_days_ahead: float
    booking_max_gpu_hours_per_week: float
    booking_max_per_user: int
    booking_grace: float
    booking_notice: float
    max_gpus_per_user: int | None
    group_gpu_limits: dict
    fairshare_shares: dict
    fairshare_group_shares: dict
    fifo_after: float
    queue_order: str

    def _own_budgets(self) -> budget.Budgets:
        return budget.Budgets(self.gpu_hour_budget, dict(self.group_gpu_hour_budgets), self.budget_period)

    def budgets(self) -> budget.Budgets:
        """The budgets in force: this hub's (a lender), else those the lending hub wrote in the ledger."""
        if self.inventory is not None:
            return self._own_budgets()
        found = getattr(self, "_ledger_budgets", None)
        if found is None:
            found = self._ledger_budgets = self._read(budget.published)
        return found

    def budget_standings(self, user: str, groups: Iterable[str] = ()) -> list[budget.Standing]:
        """The GPU-hour budgets that apply to `user`, as they stand now (empty: none)."""
        user = validation.name(user, "The user name")
        groups = tuple(validation.name(g, "A group name") for g in groups)
        b = self.budgets()
        return self._read(lambda conn: budget.standings(self._store, conn, user, groups, b, self._store.now(conn)))

    def _own_booking_limits(self) -> bookings.Limits:
        return bookings.Limits(
            max_hours=self.booking_max_hours, max_days_ahead=self.booking_max_days_ahead,
            max_gpu_hours_per_week=self.booking_max_gpu_hours_per_week, max_per_user=self.booking_max_per_user,
            grace_s=self.booking_grace, notice_s=self.booking_notice, max_gpus_per_user=self.max_gpus_per_user,
            group_gpu_limits=dict(self.group_gpu_limits))

    def booking_limits(self) -> bookings.Limits:
        """The booking limits in force: this hub's (a lender), else those the lending hub wrote in
        the ledger (the pool page, the culler), else this process's own."""
        if self.inventory is not None:
            return self._own_booking_limits()
        found = getattr(self, "_ledger_booking_limits", None)
        if found is None:
            found = self._ledger_booking_limits = self._read(bookings.published_limits) or self._own_booking_limits()
        return found

    def book(self, user: str, count: int, starts_at: datetime, ends_at: datetime, *, group: str | None = None,
             host: str | None = None, by: str | None = None, admin: bool = False,
             groups: Iterable[str] = ()) -> Booking:
        """Book `count` GPUs of one host for `user` (or `group`'s members) over [starts_at, ends_at).

        Who may book for whom (a user for themself; an admin for anyone or a group) is
        the caller's to check; `admin` False (a plain user, in `groups`) books at most
        their GPU quota, and GPUs in use only from `booking_notice` ahead.  Raises
        BookingRefused (400, with the reason: past, too long, too far ahead, too big,
        over the quota or the weekly limit, too short a notice, overlapping: with the
        next free window) or InvalidRequest."""
        user = validation.name(user, "The user name")
        group = validation.name(group, "The group name") if group is not None else None
        host = validation.name(host, "The host name") if host is not None else None
        by = validation.name(by or user, "The booker's name")
        starts_at = validation.aware(starts_at, "starts_at")
        ends_at = validation.aware(ends_at, "ends_at")
        if starts_at is None or ends_at is None:
            raise InvalidRequest("A booking needs a start and an end")
        limits = self.booking_limits()
        made = self._write(lambda conn: bookings.make(
            conn, self._store.now(conn), user=user, group=group, count=count, starts_at=starts_at, ends_at=ends_at,
            host=host, created_by=by, limits=limits, admin=admin,
            groups=tuple(validation.name(g, "A group name") for g in groups)))
        self.log.info("Booked %d GPU(s) on %s for %s from %s to %s (booking %d, by %s)", len(made.gpu_uuids),
                      made.host, f"group {group}" if group else user, made.starts_at, made.ends_at, made.id, by)
        return made

    def booking_notice_for(self, host: str, uuids: Iterable[str], user: str, groups: Iterable[str] = (),
                           what: str = "your server") -> str | None:
        """What a lease on these GPUs is told when one is booked later for someone else (else None)."""
        def read(conn):
            now = self._store.now(conn)
            later = bookings.soon(host, uuids, bookings.live(conn, now), user, tuple(groups), now)
            return bookings.notice(later, now, what) if later is not None else None
        return self._read(read)

    def bookings(self) -> list[Booking]:
        """Bookings not yet over, by start; booked GPUs unused past their grace left out.

        A read, never the write lock (the pool page and `GET api/bookings` call it on every
        view): an unused GPU is only left out here, and given back by the next grant's write."""
        grace = self.booking_limits().grace_s

        def read(conn):
            now = self._store.now(conn)
            found = bookings.live(conn, now)
            return bookings.without_unused(found, bookings.unused_gpus(conn, found, now, grace))
        return self._read(read)

    def cancel_booking(self, booking_id: int, by: str, admin: bool = False) -> Booking:
        """Cancel a live booking (its booker, or an admin)."""
        booking_id = validation.lease_id(booking_id)
        by = validation.name(by, "The user name")
        if not validation.storable_id(booking_id):
            raise bookings.UnknownBooking(f"No live booking {booking_id}")
        done = self._write(lambda conn: bookings.cancel(conn, booking_id, by, admin, self._store.now(conn)))
        self._notify()  # its GPUs may be lent now
        return done

    def lease_booked_out(self, lease_id: int) -> Booking | None:
        """For the culler: the booking for someone else that holds this active lease's GPU now."""
        lease_id = validation.lease_id(lease_id)
        if not validation.storable_id(lease_id):
            return None
        return self._read(lambda conn: bookings.lease_booked_out(conn, lease_id, self._store.now(conn)))

    def lease_over_budget(self, lease_id: int) -> budget.Standing | None:
        """For the culler: the used-up budget of an active lease's user or group, else None.

        The culler then records its intent `budget` in the ledger before it stops the server,
        and the lease's end says so."""
        lease_id = validation.lease_id(lease_id)
        b = self.budgets()
        if not b.any or not validation.storable_id(lease_id):
            return None
        return self._read(lambda conn: budget.lease_over_budget(self._store, conn, lease_id, b,
                                                                self._store.now(conn)))

    def shares(self) -> serving_order.Shares:
        return serving_order.Shares(self.fairshare_shares, self.fairshare_group_shares, self.fifo_after)

    def recent_use(self) -> rollup.Use:
        """Every user's and group's GPU-hours decayed with the fair-share half-life, now, and the
        users' all-time totals (active leases included)."""
        return self._read(lambda conn: rollup.decayed_use(self._store, conn, self._store.now(conn)))

    def fairshare(self) -> dict:
        """Every user's and group's recent use, share, standing and priority (`gpu-pool fairshare`)."""
        use = self.recent_use()
        shares = self.shares()
        users = []
        for user in sorted(set(use.users) | set(self.fairshare_shares)):
            u = use.users.get(user, 0.0)
            users.append({"user": user, "recent_gpu_hours": round(u, 3),
                          "total_gpu_hours": round(use.total_users.get(user, 0.0), 3),
                          "share": shares.user_share(user), "standing": round(u / shares.user_share(user), 3),
                          "priority": round(serving_order.priority(u / shares.user_share(user)), 4)})
        groups = []
        for group in sorted(set(use.groups) | set(self.fairshare_group_shares)):
            g = use.groups.get(group, 0.0)
            share = self.fairshare_group_shares.get(group)
            groups.append({"group": group, "recent_gpu_hours": round(g, 3), "share": share,
                           "counts": share is not None,
                           "standing": round(g / share, 3) if share else None})
        return {"order": self.queue_order, "half_life_s": use.half_life_s, "fifo_after_s": self.fifo_after,
                "at": use.at.isoformat(), "users": users, "groups": groups}

