"""The fair-use stops end to end, on the real hub, culler, pool service, ledger and Docker: a
server on a GPU booked later is told, stopped at the window's start (reason `booking`) and the
booker gets the GPU at once, past a waiter ahead of him; a waiter's estimate names the booking;
a booking nobody uses is released after its grace; a server that runs past its GPU-hour budget
is warned, then ended (reason `budget`), its home kept.

Short windows and limits come through configuration; every wait is on observable state (the
ledger's leases and bookings, the hub's server models, the pool service's answers)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from sqlalchemy import select

from ..fixtures.hub import wait_for
from .test_culling import contents, culling_hub, leases_of
from .test_poolpage import page_api, wait_for_page

# How far ahead bob's booking starts: alice's whole spawn must fit before it.
LEAD = 150


def iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def booking_state(hub, booking_id: int) -> str:
    from spawner.pool.ledger.schema import bookings_table

    with hub.ledger()._engine_ready().connect() as conn:
        return conn.execute(select(bookings_table.c.state).where(bookings_table.c.id == booking_id)).scalar_one()


def queued(hub, user: str, token: str) -> list[dict]:
    return [row for row in page_api(hub, "GET", "api/queue", token).json()["queue"] if row["yours"]]


def test_a_booked_gpu_stops_the_server_on_it_goes_to_the_booker_and_a_no_show_frees_it(make_hub):
    grace = 20
    hub = make_hub(extra_config=f"c.GPUPool.booking_grace = {grace}\n", env={
        "GPUHUB_CULL": "true", "GPUHUB_CULL_EVERY": "1", "GPUHUB_CULL_TIMEOUT_GPU": "3600",
        "GPUHUB_CULL_TIMEOUT_CPU": "3600", "GPUHUB_SIMULATED_GPUS": "1", "GPUHUB_LEASE_WAIT_TIMEOUT": "400"})
    for user in ("alice", "bob", "cy", "dee"):
        hub.create_user(user)
    tokens = {user: hub.user_token(user) for user in ("alice", "bob", "cy", "dee")}
    wait_for_page(hub, tokens["bob"])

    # bob books the only GPU from LEAD on, for half an hour.  alice's spawn must be ready before
    # the window opens: at 60 s a spawn on a loaded machine (load 15, 2 cores) was not, the culler
    # stopped it at the window's start and the test failed in start_server.
    starts = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=LEAD)
    ends = starts + timedelta(minutes=30)
    r = page_api(hub, "POST", "api/bookings", tokens["bob"], json={"count": 1, "starts_at": iso(starts),
                                                                   "ends_at": iso(ends)})
    assert r.status_code == 201, r.text
    booking = r.json()

    # alice starts before the window: she gets the GPU and is told when she loses it.
    hub.start_server("alice", {"profile": "tf-gpu-1"})
    assert datetime.now(UTC) < starts, f"alice's spawn took longer than the booking's lead ({LEAD} s)"
    (alice,) = leases_of(hub, "alice")
    told = f"This GPU is booked from {starts.strftime('%a %H:%M')} UTC, in "
    log = hub.log_tail(300)  # the spawn's progress message, as the spawner logs it
    assert told in log and "your server will be stopped then (reason: booking)" in log
    assert page_api(hub, "GET", "api/wait", tokens["alice"]).json()["booked"]["alice"].startswith(told)
    # A plain user cannot book it out from under alice at short notice (issue 42, item 2): after
    # bob's window, still within the hour's notice, is refused, saying from when it could start.
    r = page_api(hub, "POST", "api/bookings", tokens["dee"], json={
        "count": 1, "starts_at": iso(ends + timedelta(minutes=1)), "ends_at": iso(ends + timedelta(minutes=20))})
    assert r.status_code == 400 and "at least 60 minutes ahead" in r.json()["message"], r.text

    # cy waits for it: her estimate says the booking, not alice, is what she waits for.
    r = hub.api("POST", "/users/cy/server", json={"profile": "tf-gpu-1"}, timeout=60)
    assert r.status_code == 202, r.text
    wait_for(lambda: queued(hub, "cy", tokens["cy"]), 60, "cy in the queue", hub)
    [row] = [q for q in page_api(hub, "GET", "api/wait", tokens["cy"]).json()["queue"] if q["yours"]]
    assert row["estimate_why"] == f"a booking of a GPU ends at {ends.strftime('%H:%M')} UTC", row
    assert -2 < row["estimate_s"] - (ends - datetime.now(UTC)).total_seconds() < 60, row
    # bob waits behind her.
    r = hub.api("POST", "/users/bob/server", json={"profile": "tf-gpu-1"}, timeout=60)
    assert r.status_code == 202, r.text
    wait_for(lambda: queued(hub, "bob", tokens["bob"]), 60, "bob in the queue", hub)

    # At the window's start the culler stops alice's server, reason `booking` ...
    wait_for(lambda: hub.ledger().lease(alice.id).ended_at is not None, LEAD + 120, "alice's lease to end", hub)
    ended = hub.ledger().lease(alice.id)
    assert ended.end_reason == "booking" and ended.ended_at >= starts
    hub.wait_stopped("alice", timeout=60)
    # ... and bob, the booker, gets its GPU at once, though cy waited before him (and still does).
    (bob,) = wait_for(lambda: leases_of(hub, "bob"), 60, "bob's lease", hub)
    assert bob.gpu_uuids == alice.gpu_uuids and bob.ended_at is None
    hub.wait_ready("bob")
    assert queued(hub, "cy", tokens["cy"]) and not leases_of(hub, "cy")

    # bob gives the booking back: cy's wait ends with the GPU.
    assert page_api(hub, "DELETE", f"api/bookings/{booking['id']}", tokens["bob"]).status_code == 200
    hub.stop_server("bob")
    wait_for(lambda: leases_of(hub, "cy"), 60, "cy's lease", hub)
    hub.wait_ready("cy")
    hub.stop_server("cy")

    # dee books it from now and never comes: alice waits while the booking holds it, and gets
    # it once the grace has passed and the booking is released.
    now = datetime.now(UTC).replace(microsecond=0)
    r = page_api(hub, "POST", "api/bookings", tokens["dee"], json={"count": 1, "starts_at": iso(now),
                                                                   "ends_at": iso(now + timedelta(hours=1))})
    assert r.status_code == 201, r.text
    no_show = r.json()["id"]
    r = hub.api("POST", "/users/alice/server", json={"profile": "tf-gpu-1"}, timeout=60)
    assert r.status_code == 202, r.text
    wait_for(lambda: queued(hub, "alice", tokens["alice"]), 60, "alice in the queue", hub)
    assert booking_state(hub, no_show) == "booked"
    wait_for(lambda: len(leases_of(hub, "alice")) == 2, grace + 60, "alice's lease after the no-show", hub)
    assert booking_state(hub, no_show) == "released"
    assert leases_of(hub, "alice")[-1].started_at >= now + timedelta(seconds=grace)
    hub.wait_ready("alice")


def test_a_server_past_its_gpu_hour_budget_is_warned_then_ended_and_its_home_kept(make_hub):
    budget = 0.025  # GPU-hours: 90 s of one GPU
    hub = culling_hub(make_hub, GPUHUB_SIMULATED_GPUS=1, GPUHUB_CULL_TIMEOUT_GPU=3600,
                      GPUHUB_CULL_TIMEOUT_CPU=3600, GPUHUB_GPU_HOUR_BUDGET=budget)
    hub.create_user("alice")
    token = hub.user_token("alice")
    wait_for_page(hub, token)

    hub.start_server("alice", {"profile": "tf-gpu-1"})
    contents(hub, "alice", token, "kept.txt", "written before the budget ran out\n")
    (lease,) = leases_of(hub, "alice")
    # Warned: the pool service says when what she holds uses the budget up, and that it stops then.
    [row] = page_api(hub, "GET", "api/wait", token).json()["budgets"]
    runs_out = lease.started_at + timedelta(hours=budget)
    assert row["runs_out_at"] and abs((datetime.fromisoformat(row["runs_out_at"]) - runs_out).total_seconds()) < 5
    assert f"of your {budget:g} GPU-hours in the last 7 days" in row["message"]
    assert "uses it up at" in row["message"] and row["message"].endswith("when it is stopped")

    # Past it, the culler ends the server: reason `budget`, once the budget is used up.
    wait_for(lambda: hub.ledger().lease(lease.id).ended_at is not None, 240, "the lease to end", hub)
    ended = hub.ledger().lease(lease.id)
    assert ended.end_reason == "budget" and ended.ended_at >= runs_out - timedelta(seconds=1)
    hub.wait_stopped("alice", timeout=60)

    # A new GPU server is refused with the budget's message; a CPU one starts, her home is there.
    # What she used is the lease's length, longer than the budget by the culler's pass and
    # Docker's stop.  A lease that ended past 0.05 GPU-hours (180 s, 90 s after the budget ran
    # out, on a loaded machine) is rightly said as "0.1": the old assertion wanted "0.0" always.
    _, message = hub.refused_spawn("alice", {"profile": "tf-gpu-1"})
    used = (ended.ended_at - ended.started_at).total_seconds() / 3600
    said = re.search(rf"You have used (\d+\.\d) of your {budget:g} GPU-hours in the last 7 days", message)
    assert said and abs(float(said.group(1)) - used) <= 0.05 + 1e-9, (used, message[-2000:])
    hub.start_server("alice", {"profile": "tf-cpu"})
    assert contents(hub, "alice", token, "kept.txt") == "written before the budget ran out\n"
