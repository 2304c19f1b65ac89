"""Wait estimates played forward over what is known: job timeouts and bookings (estimate.py, wait.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from spawner.pool.bookings import Booking
from spawner.pool.jobs import Job
from spawner.pool.models import Lease
from spawner.poolpage import estimate
from spawner.poolpage.handlers.wait import known_ends

pytestmark = pytest.mark.unit

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
H = timedelta(hours=1)
M = timedelta(minutes=1)
LENGTHS = [4 * 3600.0]  # past leases ran 4 h: a lease of typical length ends at its start + 4 h


def booking(user: str, uuid: str, starts: datetime, ends: datetime, group: str | None = None) -> Booking:
    return Booking(1, user, group, "node", (uuid,), starts, ends, user)


def job(job_id: int, started: datetime, timeout_s: int, state: str = "running") -> Job:
    return Job(job_id, "ann", (), "p", ("python",), "/home/ann", timeout_s, "node", 1000, 100, state, 7, None,
               ("g0",), None, None, started, started, None)


def test_a_running_jobs_lease_is_back_at_its_start_plus_its_timeout():
    lease = Lease(7, "ann", "job/3", "node", ("g0",), (), NOW - 10 * M, None)
    ends = known_ends(lease, {3: job(3, NOW - 10 * M, 1800)}, [], NOW, "ann's")
    assert ends == ((NOW + 20 * M, "ann's job reaches its timeout at 12:20 UTC"),)
    holding = estimate.Holding(lease.started_at, 1, ends=ends, slots=(("node", "g0"),))
    # Sooner than the typical 4 h lease: the timeout is what the waiter is told.
    assert estimate.waits_explained([1], 0, [holding], NOW, LENGTHS) == [
        (1200.0, "ann's job reaches its timeout at 12:20 UTC")]
    # The culler stops servers, not jobs: a booking of its GPU does not end it.
    later = booking("bob", "g0", NOW + 5 * M, NOW + H)
    assert known_ends(lease, {3: job(3, NOW - 10 * M, 1800)}, [later], NOW, "ann's") == ends
    # A notebook server of the same age has no timeout: the typical length holds.
    server = Lease(8, "ann", "", "node", ("g0",), (), NOW - 10 * M, None)
    assert known_ends(server, {3: job(3, NOW - 10 * M, 1800)}, [], NOW, "ann's") == ()
    assert estimate.waits_explained([1], 0, [estimate.Holding(server.started_at, 1)], NOW, LENGTHS) == [
        (4 * 3600.0 - 600.0, "a lease of typical length ends")]


def test_a_gpu_booked_by_someone_else_is_free_for_a_waiter_only_when_the_booking_ends():
    # g0 is free now but booked by bob from now to 14:00; g1 is lent (typical end 13:00).
    bob = booking("bob", "g0", NOW - 5 * M, NOW + 2 * H)
    lent = estimate.Holding(NOW - 3 * H, 1, slots=(("node", "g1"),))
    got = estimate.waits_explained([1, 1], 1, [lent], NOW, LENGTHS, bookings=[bob],
                                   who=[("cy", ()), ("dee", ())], free_slots=[("node", "g0")])
    assert got == [(3600.0, "a lease of typical length ends"),
                   (7200.0, "a booking of a GPU ends at 14:00 UTC")]
    # bob himself (or his group's members) is served from it at once.
    assert estimate.waits_explained([1], 1, [lent], NOW, LENGTHS, bookings=[bob], who=[("bob", ())],
                                    free_slots=[("node", "g0")]) == [(0.0, "GPUs are free now")]
    course = booking("ada", "g0", NOW - 5 * M, NOW + 2 * H, group="course")
    assert estimate.waits_explained([1], 1, [], NOW, LENGTHS, bookings=[course], who=[("eve", ("course",))],
                                    free_slots=[("node", "g0")]) == [(0.0, "GPUs are free now")]


def test_a_lease_on_a_gpu_booked_later_ends_at_the_bookings_start():
    # ann holds g0 since 11:00; bob booked it 12:30-13:30: ann's server is stopped at 12:30.
    lease = Lease(9, "ann", "", "node", ("g0",), (), NOW - H, None)
    bob = booking("bob", "g0", NOW + 30 * M, NOW + 90 * M)
    ends = known_ends(lease, {}, [bob], NOW, "a")
    assert ends == ((NOW + 30 * M, "a server is stopped at 12:30 UTC for a booking"),)
    holding = estimate.Holding(lease.started_at, 1, ends=ends, slots=(("node", "g0"),))
    # bob, waiting, gets it when the booking starts; cy only when it ends.
    assert estimate.waits_explained([1], 0, [holding], NOW, LENGTHS, bookings=[bob], who=[("bob", ())]) == [
        (1800.0, "a server is stopped at 12:30 UTC for a booking")]
    assert estimate.waits_explained([1], 0, [holding], NOW, LENGTHS, bookings=[bob], who=[("cy", ())]) == [
        (5400.0, "a booking of a GPU ends at 13:30 UTC")]
    # cy waits first, bob behind her: the queue lets bob pass (the GPU is not cy's in the window).
    assert estimate.waits_explained([1, 1], 0, [holding], NOW, LENGTHS, bookings=[bob],
                                    who=[("cy", ()), ("bob", ())]) == [
        (5400.0, "a booking of a GPU ends at 13:30 UTC"), (1800.0, "a server is stopped at 12:30 UTC for a booking")]
    # The booker's own lease is not cut by the booking.
    assert known_ends(Lease(9, "bob", "", "node", ("g0",), (), NOW - H, None), {}, [bob], NOW, "a") == ()


def test_a_gpu_coming_back_inside_someone_elses_booking_waits_for_its_end():
    # g1 is back at 13:00 (its typical end), but bob booked it 12:45-15:00: for cy it is free at 15:00.
    lent = estimate.Holding(NOW - 3 * H, 1, slots=(("node", "g1"),))
    b = booking("bob", "g1", NOW + 45 * M, NOW + 3 * H)
    assert estimate.waits_explained([1], 0, [lent], NOW, LENGTHS, bookings=[b], who=[("cy", ())]) == [
        (3 * 3600.0, "a booking of a GPU ends at 15:00 UTC")]
    # Without bookings, the old count model: the same answer as before.
    assert estimate.waits([1], 0, [lent], NOW, LENGTHS) == [3600.0]
