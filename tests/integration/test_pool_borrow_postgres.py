"""The 12 -> 13 migration (borrowing, issue 38) on a real PostgreSQL server: its ALTERs (booleans
spelled `false`/`true`, TIMESTAMP) add the columns in place, and rows from before read as
within their share.  The same scenario as tests/unit/test_pool_borrow.py's on SQLite."""

from __future__ import annotations

from ..unit import test_pool_borrow as scenarios


def test_postgres_a_version_12_ledger_gains_the_borrowing_columns_in_place(postgres_database):
    scenarios.a_version_12_ledger_gains_the_borrowing_columns_in_place(postgres_database)
