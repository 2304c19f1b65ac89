"""The ledger's record over time (leases, drains, the queue log) on a real PostgreSQL."""

from __future__ import annotations

from tests.unit.test_poolpage_history import hourly_series_match_the_leases, records_over_time
from tests.unit.test_timeline_rollups import drained_series_from_the_period, queue_chart_from_the_rollup


def test_postgres_records_leases_drains_and_the_queue_over_time(postgres_database):
    records_over_time(postgres_database)


def test_postgres_a_long_periods_chart_from_the_hourly_rollup_matches_the_leases(postgres_database):
    hourly_series_match_the_leases(postgres_database)


def test_postgres_the_queue_chart_of_a_long_period_reads_the_hourly_rollup(postgres_database):
    queue_chart_from_the_rollup(postgres_database)


def test_postgres_the_drained_series_reads_the_drains_of_its_period(postgres_database):
    drained_series_from_the_period(postgres_database)
