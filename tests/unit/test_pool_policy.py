"""The pool's policy and placement as pure functions: no database, no inventory."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from spawner.pool.leasing.placement import choose
from spawner.pool.leasing.policy import Snapshot, WaiterRow, available_after, check_feasible, check_quota, limit_for
from spawner.pool.models import QuotaExceeded, Unsatisfiable
from spawner.pool.validation import Request

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def far(host, a, b):
    return 50


def pairs(host, a, b):
    # GPUs 0-1 and 2-3 sit on one switch each.
    return 10 if int(a[-1]) // 2 == int(b[-1]) // 2 else 50


def snap(**hosts: int) -> Snapshot:
    return Snapshot.from_rows(
        (h, f"{h}-gpu{i}", i, True, False, None) for h, n in hosts.items() for i in range(n)
    )


def req(count, user="alice", hosts=None, groups=()):
    return Request(user, "", count, tuple(groups), hosts)


def waiter(id_, count, age_s, hosts=None):
    return WaiterRow(id_, f"u{id_}", count, hosts, NOW - timedelta(seconds=age_s), NOW)


def test_a_user_gets_the_largest_limit_of_their_groups():
    limits = {"students": 1, "ml": 4}
    assert limit_for(["students", "ml"], limits, 2) == (4, "the limit of group 'ml'")
    assert limit_for(["other"], limits, 2) == (2, "the per-user limit")
    assert limit_for(["ml", "staff"], {"ml": 4, "staff": None}, 0) == (None, "group limits")


def test_quota_counts_what_the_user_already_holds():
    check_quota(req(1), 2, "the per-user limit", held=lambda: (1, ["a"]))
    with pytest.raises(QuotaExceeded, match="you hold 2 .*'a', 'b'.* asked for 1 more"):
        check_quota(req(1), 2, "the per-user limit", held=lambda: (2, ["a", "b"]))
    with pytest.raises(QuotaExceeded, match="at most 1 GPU .* asked for 3"):
        check_quota(req(3), 1, "the per-user limit", held=lambda: pytest.fail("not needed"))


def test_a_request_bigger_than_any_host_is_refused_with_the_largest_size():
    with pytest.raises(Unsatisfiable, match="largest host has 4 GPUs; ask for 4 or fewer"):
        check_feasible(snap(a=4, b=2), req(5))
    check_feasible(snap(a=4, b=2), req(4))


def test_an_earlier_waiter_that_fits_takes_its_gpus_first():
    avail = available_after(snap(a=2), [waiter(1, 1, 0)], NOW, 15, lambda f, h, c: choose(f, h, c, far))
    assert sum(len(v) for v in avail.values()) == 1


def test_a_big_waiter_lets_small_ones_pass_only_within_the_backfill_window():
    pick = lambda f, h, c: choose(f, h, c, far)  # noqa: E731
    s = Snapshot.from_rows([("a", f"g{i}", i, True, False, 7 if i < 2 else None) for i in range(4)])
    young = available_after(s, [waiter(1, 4, 5)], NOW, 15, pick)
    assert len(young["a"]) == 2  # not met yet, still young: later requests may pass
    old = available_after(s, [waiter(1, 4, 20)], NOW, 15, pick)
    assert old["a"] == []  # waited past the window: the free GPUs are held for it


def test_placement_prefers_the_fullest_host_that_fits_and_close_pairs():
    free = {"a": [(i, f"a-gpu{i}") for i in range(4)], "b": [(0, "b-gpu0"), (1, "b-gpu1")]}
    assert choose(free, None, 2, pairs)[0] == "b"
    host, uuids = choose({"a": [(0, "a-gpu0"), (2, "a-gpu2"), (3, "a-gpu3")]}, None, 2, pairs)
    assert uuids == ["a-gpu2", "a-gpu3"]  # the pair on one switch
    # One GPU: the isolated one, so that the close pair stays free.
    assert choose({"a": [(0, "a-gpu0"), (2, "a-gpu2"), (3, "a-gpu3")]}, None, 1, pairs)[1] == ["a-gpu0"]
    assert choose(free, ["b"], 3, pairs) is None
