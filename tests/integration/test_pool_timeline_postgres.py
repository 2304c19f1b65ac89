"""The ledger's record over time (leases, drains, the queue log) on a real PostgreSQL."""

from __future__ import annotations

from tests.unit.test_poolpage_history import records_over_time


def test_postgres_records_leases_drains_and_the_queue_over_time(postgres_database):
    records_over_time(postgres_database)
