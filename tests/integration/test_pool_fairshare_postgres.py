"""Fair-share and the rolled-up history on a real PostgreSQL ledger (the SQLite twins:
tests/unit/test_pool_fairshare.py)."""

from __future__ import annotations

from tests.unit.test_pool_fairshare import lighter_user_first, usage_matches_the_exact_sum


def test_postgres_usage_from_the_rollups_matches_the_leases(postgres_database):
    usage_matches_the_exact_sum(postgres_database)


def test_postgres_serves_the_lighter_user_first(postgres_database):
    winner, told = lighter_user_first(postgres_database, fifo_after=600)
    assert winner == "light" and any(t.startswith("2nd in the queue: 1 request from someone with less") for t in told)


def test_postgres_serves_the_heavier_user_after_fifo_after(postgres_database):
    winner, _ = lighter_user_first(postgres_database, fifo_after=1.0)
    assert winner == "heavy"


def test_postgres_budget_refuses_and_ends(postgres_database):
    from tests.unit.test_pool_fairshare import budget_refuses_and_ends

    budget_refuses_and_ends(postgres_database)


def test_postgres_booking_holds_warns_stops_and_frees_on_no_show(postgres_database):
    from tests.unit.test_pool_bookings import guarantee_warning_stop_and_no_show

    guarantee_warning_stop_and_no_show(postgres_database)


def test_postgres_group_budgets_count_the_hours_of_exactly_their_group(postgres_database):
    from tests.unit.test_pool_fairshare import group_budgets_match_groups_exactly

    group_budgets_match_groups_exactly(postgres_database)


def test_postgres_fair_use_check_stops_a_running_job_past_its_budget(postgres_database):
    from tests.unit.test_job_fair_use import budget_stops_only_the_job_past_it

    budget_stops_only_the_job_past_it(postgres_database)


def test_postgres_fair_use_check_stops_a_job_on_a_booked_gpu(postgres_database):
    from tests.unit.test_job_fair_use import booking_stops_the_job_once_it_begins

    booking_stops_the_job_once_it_begins(postgres_database)
