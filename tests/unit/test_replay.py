"""bench/replay.py on a trace small enough to replay by hand: two users, two GPUs, five requests.

The replay drives the real pool on a virtual clock; every figure of its table is checked
against the arithmetic below (times in seconds from the start; horizon 4 h; capacity 8 GPU-h).

  t=0     alice opens a 1-GPU server: busy 0-3600, then idle (she would keep it until 7200)
  t=0     bob's 1-GPU job runs 0-3600
  t=600   bob's 2-GPU job waits (FIFO): one GPU frees at 3600, alice holds the other
  t=5400  the culler's pass (every 600 s, GPU idle limit 1800 s; alice's last activity,
          reported every 300 s, is 3600) culls alice's idle server; bob's 2-GPU job starts
          (waited 4800 s) and runs until 9000
  t=6000  alice opens a server again (busy 0-600): both GPUs are lent, she gives up at 6300
  t=9600  bob opens a 1-GPU server: busy 0-600, stopped at 10800

Lent: alice 1.5 + job 1 + 2-GPU job 2 + bob's server 1/3 = 29/6 GPU-h.
Busy: 1 + 1 + 2 + 1/6 = 25/6 GPU-h.  Work due (= demand, under capacity): alice 7/6, bob 19/6;
done: alice 1, bob 19/6, so Jain = (6/7 + 1)^2 / (2 ((6/7)^2 + 1)).
"""

from __future__ import annotations

import pytest

from bench import replay as R
from bench import replay_workload as wl
from spawner.culling.deadline import CullRules


def request(rid, kind, user, arrive, gpus, busy, hold, limit=None):
    return wl.Request(rid, kind, user, (), arrive, gpus, busy=busy, hold=hold, limit=limit)


TRACE = wl.Trace(
    hosts=1, gpus_per_host=2, users=["alice", "bob"], heavy=set(), groups={"alice": (), "bob": ()},
    requests=[
        request(0, "session", "alice", 0, 1, ((0, 3600),), 7200),
        request(1, "job", "bob", 0, 1, ((0, 3600),), 3600, limit=7200),
        request(2, "job", "bob", 600, 2, ((0, 3600),), 3600, limit=7200),
        request(3, "session", "alice", 6000, 1, ((0, 600),), 900),
        request(4, "session", "bob", 9600, 1, ((0, 600),), 1200),
    ],
    horizon=4 * 3600.0,
)

POLICY = R.Policy("hand", {"queue_order": "fifo", "backfill_window": 0.0}, CullRules(1800, 1800),
                  cull_every=600, activity_interval=300)


def test_a_hand_computed_trace_gives_every_figure():
    m = R.replay(TRACE, POLICY)
    assert m.capacity_gpu_hours == 8
    assert m.lent_gpu_hours == pytest.approx(29 / 6)
    assert m.busy_gpu_hours == pytest.approx(25 / 6)
    assert m.busy_share == pytest.approx(25 / 29)
    assert sorted(m.interactive_waits) == [0, 0, 300]
    assert (R.percentile(m.interactive_waits, .5), R.percentile(m.interactive_waits, .95),
            R.percentile(m.interactive_waits, .99)) == (0, 300, 300)
    assert sorted(m.job_waits) == [0, 4800]
    assert (R.percentile(m.job_waits, .5), R.percentile(m.job_waits, .95)) == (0, 4800)
    assert m.due == pytest.approx({"alice": 7 / 6, "bob": 19 / 6})
    assert m.done == pytest.approx({"alice": 1.0, "bob": 19 / 6})
    assert m.jain == pytest.approx((6 / 7 + 1) ** 2 / (2 * ((6 / 7) ** 2 + 1)))
    assert (m.bookings, m.bookings_honoured) == (0, 0)
    assert (m.busy_culled, m.idle_culled, m.stopped_budget, m.stopped_booking) == (0, 1, 0, 0)
    assert (m.gave_up, m.refused, m.respawns) == (1, 0, 0)  # (alice had no more work in that server)
    assert m.lost_busy_gpu_hours == pytest.approx(1 / 6)
    # Free GPUs while someone waited: one GPU 3600-5400 (bob's 2-GPU job waits), none 6000-6300.
    assert m.free_while_waiting_gpu_hours == pytest.approx(0.5)
    # Lent but idle while someone waited: alice's server 3600-5400, while bob's 2-GPU job waited.
    assert m.idle_while_waiting_gpu_hours == pytest.approx(0.5)
    # The plots' series, 10-minute means: 24 steps; both GPUs busy in the first hour; alice's
    # idle GPU from 3600 to her cull at 5400; in 6000-6600 the 2-GPU job runs (alice gave up).
    assert len(m.lent_series) == len(m.busy_series) == 24
    assert m.lent_series[:6] == m.busy_series[:6] == [2.0] * 6
    assert (m.lent_series[6:9], m.busy_series[6:9]) == ([1.0] * 3, [0.0] * 3)
    assert m.lent_series[10] == m.busy_series[10] == 2.0
    assert sum(m.lent_series) * R.SERIES_STEP / 3600 == pytest.approx(m.lent_gpu_hours)
    assert sum(m.busy_series) * R.SERIES_STEP / 3600 == pytest.approx(m.busy_gpu_hours)


def test_without_a_culler_the_idle_server_keeps_its_gpu():
    """The same trace with no culling: bob's 2-GPU job waits for alice to stop at 7200."""
    m = R.replay(TRACE, R.Policy("fifo", {"queue_order": "fifo", "backfill_window": 0.0}, None))
    assert sorted(m.job_waits) == [0, 6600]
    assert m.idle_culled == 0
    # Lent: alice 0-7200, bob's job 0-3600, the 2-GPU job 7200-10800.  At 6000 one GPU is
    # free but held for the 2-GPU job ahead (FIFO, no backfill): alice gives up at 6300; bob's
    # server at 9600 finds both lent and gives up at 9900.
    assert m.lent_gpu_hours == pytest.approx(2 + 1 + 2)
    assert m.gave_up == 2


def test_the_generated_week_has_the_workloads_parts():
    """The generator's week (the full replay is make bench-replay), the same for the same seed."""
    trace = wl.generate(wl.SIZES["small"], seed=1)
    assert trace.requests == wl.generate(wl.SIZES["small"], seed=1).requests
    kinds = {r.kind for r in trace.requests}
    assert kinds == {"session", "job"}
    assert any(r.workers == 2 for r in trace.requests) and any(r.workers == 4 for r in trace.requests)
    durations = [r.hold for r in trace.requests if r.kind == "job"]
    assert max(durations) / min(durations) >= 1000  # three orders of magnitude
    assert 0.6 < trace.offered_gpu_hours() / (trace.capacity * 168) < 0.8
    text = R.table([R.replay(TRACE, POLICY)])
    assert "| hand |" in text


def test_a_user_whose_server_was_culled_comes_back_for_the_rest_of_the_work():
    """Busy 0-600 and 4000-4600, kept until 5000: culled at the 2400 pass (600 + 1800), the user
    spawns again at 4000 for the rest, which ends at 5000."""
    trace = wl.Trace(hosts=1, gpus_per_host=1, users=["alice"], heavy=set(), groups={"alice": ()},
                     requests=[request(0, "session", "alice", 0, 1, ((0, 600), (4000, 4600)), 5000)],
                     horizon=2 * 3600.0)
    m = R.replay(trace, POLICY)
    assert (m.idle_culled, m.respawns, m.busy_culled) == (1, 1, 0)
    assert m.lent_gpu_hours == pytest.approx((2400 + 1000) / 3600)
    assert m.busy_gpu_hours == pytest.approx(1200 / 3600)
    assert sorted(m.interactive_waits) == [0, 0]


def test_work_after_a_quiet_spell_is_known_to_the_hub_at_once_and_not_culled():
    """Started at 100, busy 100-700 and 2850-3450, kept until 3700; reports every 300 s from 100.
    The 3000 pass: the last report (2800) came before the work started again (2850), so the hub
    knows only 700, 2300 s ago (over the 1800 s limit): culled while busy.  With the immediate
    post after a quiet spell (2150 s, over 600 s) the hub knows 2850: not culled."""
    trace = wl.Trace(hosts=1, gpus_per_host=1, users=["alice"], heavy=set(), groups={"alice": ()},
                     requests=[request(0, "session", "alice", 100, 1, ((0, 600), (2750, 3350)), 3600)],
                     horizon=2 * 3600.0)
    m = R.replay(trace, POLICY)
    assert (m.busy_culled, m.idle_culled) == (1, 0)
    m = R.replay(trace, R.replace(POLICY, quiet_after=600))
    assert (m.busy_culled, m.idle_culled) == (0, 0)
    assert m.lent_gpu_hours == pytest.approx(1)


def test_the_products_policy_posts_after_a_third_of_the_shortest_limit():
    (product,) = [p for p in R.policies() if p.name == "product"]
    assert product.quiet_after == product.rules.shortest // 3
    assert all(p.quiet_after is None for p in R.policies() if p.name != "product")


def test_borrowing_side_by_side_a_job_beyond_its_share_runs_and_is_reclaimed_for_servers():
    # Quota 1: bob's 2-GPU job at t=600 is beyond his share.  Off: refused.  On: it borrows both
    # GPUs once they are free (5400, after the cull); alice's server at 6000, within her share,
    # asks them back: the job heeds the notice 30 s later (6030), keeping the 600 s of its last
    # checkpoint (one every 600 s), and queues again; it borrows again when alice stops (6930),
    # and bob's own server at 9600 (within his share: the borrowed job does not count) asks it
    # back at 9630, after 2700 s kept to 2400; its third run does the last 600 s (10830-11430).
    # Lost: 30 s + 300 s on 2 GPUs = 11 GPU-minutes; borrowed 2 x (630 + 2700 + 600) s.
    off, on = R.borrowing_policies(1)
    off, on = (R.replace(p, rules=CullRules(1800, 1800), cull_every=600, activity_interval=300, quiet_after=None,
                         bookings=False, budgets=False, contention=False,
                         pool={**p.pool, "queue_order": "fifo", "backfill_window": 0}) for p in (off, on))
    m_off, m_on = R.replay(TRACE, off), R.replay(TRACE, on)
    assert m_off.borrowed_gpu_hours == 0 and m_off.refused == 1 and m_off.reclaims == 0
    assert m_on.reclaims == 2 and m_on.refused == 0
    assert m_on.reclaim_lost_gpu_minutes == pytest.approx(11)
    assert m_on.borrowed_gpu_hours == pytest.approx(2 * (630 + 2700 + 600) / 3600)
    assert m_on.reclaimed_gpu_hours == pytest.approx(2 * (630 + 2700) / 3600)
    assert m_on.lent_gpu_hours > m_off.lent_gpu_hours
    assert "| reclaims |" in R.borrowing_table([m_off, m_on])


def test_the_plots_are_pngs_of_the_weeks_replays(tmp_path):
    """--plots: GPUs lent and busy per policy, and the waits' distributions, as PNG files."""
    from bench import replay_plots

    rows = [R.replay(TRACE, POLICY), R.replay(TRACE, R.Policy("fifo", POLICY.pool, None))]
    paths = replay_plots.plot(rows, TRACE.capacity, TRACE.horizon, R.SERIES_STEP, str(tmp_path), "tiny",
                              title="tiny")
    assert [p.rsplit("/", 1)[-1] for p in paths] == ["tiny-gpus.png", "tiny-waits.png"]
    for path in paths:
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_several_seeds_print_a_table_each_and_the_goals(capsys, monkeypatch):
    """--seed 1 2 (a week of 2 GPUs and 3 users, FIFO only, to be quick): a table per seed; the
    goals' table has a row per seed of the product's policy (here the hand-made trace's)."""
    monkeypatch.setitem(wl.SIZES, "tiny", wl.Size(hosts=1, gpus_per_host=2, users=3))
    assert R.main(["--size", "tiny", "--seed", "1", "2", "--policy", "fifo"]) == 0
    out = capsys.readouterr().out
    assert "seed 1:" in out and "seed 2:" in out and out.count("| fifo |") == 2
    assert R.goals_table([("small, seed 1", R.replay(TRACE, POLICY))]).splitlines()[2].startswith(
        "| small, seed 1 | 86% | 5.0 | ")
