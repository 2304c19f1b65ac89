"""Notifications outside the tab against a real hub: a spawn queued behind a full pool gets its
"granted" mail from the gpu-pool service, through a real SMTP server on loopback, within
seconds of the grant (issue 39)."""

from __future__ import annotations

import statistics

import pytest
import requests

from spawner.notify import directory
from spawner.pool.ledger import outbox

from ..fixtures.hub import wait_for

pytest.importorskip("aiosmtpd.controller")
from ..fixtures.smtp import SMTPServer  # noqa: E402

ADDRESS = "gus@example.org"
ROUNDS = 3


def config(port: int) -> str:
    return f"""
c.EmailNotifications.enabled = True
c.EmailNotifications.smtp_host = "127.0.0.1"
c.EmailNotifications.smtp_port = {port}
c.EmailNotifications.security = "none"
c.EmailNotifications.from_address = "GPU hub <gpu-hub@example.org>"
c.EmailNotifications.public_url = "https://hub.example.org"
c.EmailNotifications.mails_per_hour = 10
"""


def test_a_queued_spawn_gets_its_granted_mail_within_seconds_of_the_grant(make_hub, capsys):
    with SMTPServer() as smtp:
        hub = make_hub(config(smtp.port))
        for user in ("eve", "fay", "gus"):
            hub.create_user(user)
        token = hub.user_token("gus")
        api = f"{hub.url}/services/gpu-pool/api/notifications"

        def page_up():
            try:
                return requests.get(api, headers={"Authorization": f"token {token}"}, timeout=10).status_code == 200
            except requests.RequestException:
                return False
        wait_for(page_up, timeout=60, what="the gpu-pool service", hub=hub)
        # gus's address as the directory's login would have recorded it (auth_state's mail), and
        # his choice, through the service's API: a mail even for a short wait.
        directory.record_address(hub.ledger(), "gus", {"user_attributes": {"mail": [ADDRESS]}})
        r = requests.put(api, json={"events": {"granted": {"email": "always"}}},
                         headers={"Authorization": f"token {token}"}, timeout=10)
        assert r.status_code == 200, r.text
        assert r.json()["address"] == ADDRESS and r.json()["channels"]["email"]["enabled"] is True

        hub.start_server("fay", {"profile": "tf-gpu-2"})
        latencies = []
        for n in range(1, ROUNDS + 1):
            hub.start_server("eve", {"profile": "tf-gpu-2"})  # the pool is full
            r = hub.api("POST", "/users/gus/server", json={"profile": "tf-gpu-1"})
            assert r.status_code == 202, r.text  # queued
            wait_for(lambda: hub.ledger().queue(), timeout=30, what="gus in the queue", hub=hub)
            assert len(smtp.inbox.messages) == n - 1  # nothing before the grant
            hub.stop_server("eve")  # the grant
            wait_for(lambda n=n: len(smtp.inbox.messages) == n, timeout=30, what=f"mail {n}", hub=hub)
            event = hub.ledger()._store.read(lambda conn: outbox.entries(conn, "gus", 1))[0]
            assert event["event"] == "granted" and event["state"] == "sent"
            latencies.append(smtp.inbox.received_at[-1] - event["created_at"].timestamp())
            hub.wait_ready("gus", timeout=60)
            hub.stop_server("gus")

        to, msg = smtp.inbox.messages[0]
        assert to == [ADDRESS] and msg["To"] == ADDRESS
        assert msg["Subject"] == "GPU hub: Your GPU is granted: your server (default) is starting"
        assert "https://hub.example.org/hub/spawn-pending/gus" in msg.get_body(("plain",)).get_content()
        assert msg["List-Unsubscribe"].startswith("<https://hub.example.org/services/gpu-pool/notifications/")
        assert max(latencies) < 10, latencies
        with capsys.disabled():
            print(f"\ngrant -> delivered mail, {ROUNDS} rounds: median {statistics.median(latencies):.3f} s, "
                  f"all {[round(x, 3) for x in latencies]}")
