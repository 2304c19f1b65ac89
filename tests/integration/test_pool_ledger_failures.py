"""The ledger on a real PostgreSQL when things go wrong: clocks that disagree, a server that stops answering."""

from __future__ import annotations

from tests.unit.test_pool_failures import slow_clock_keeps_its_place


def test_postgres_a_hub_whose_clock_is_behind_keeps_its_place_in_the_queue(postgres_database):
    slow_clock_keeps_its_place(postgres_database)
