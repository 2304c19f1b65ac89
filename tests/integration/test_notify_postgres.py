"""The notification outbox's scenarios of tests/unit/test_notify.py on PostgreSQL: at most once with
two senders at once, a crashed sender's rows settled, a flood turned into a digest."""

from __future__ import annotations

import pytest

pytest.importorskip("aiosmtpd.controller")

from ..fixtures.smtp import SMTPServer  # noqa: E402
from ..unit import test_notify as scenarios  # noqa: E402


@pytest.fixture
def smtp_server():
    with SMTPServer() as server:
        yield server


def test_postgres_a_queued_grant_is_mailed_once_by_two_senders(postgres_database, smtp_server):
    scenarios.a_queued_grant_writes_its_event_with_the_lease_and_is_mailed_once(postgres_database, smtp_server)


def test_postgres_a_crashed_senders_rows_are_settled_at_most_once(postgres_database, smtp_server):
    scenarios.after_a_crash_unsent_claims_are_sent_and_half_sent_ones_never_again(postgres_database, smtp_server)


def test_postgres_a_flood_becomes_a_digest(postgres_database, smtp_server):
    scenarios.a_flood_of_job_ends_becomes_a_digest_within_the_hourly_limit(postgres_database, smtp_server)
