"""Notifications outside the tab against a real hub: a spawn queued behind a full pool gets its
"ready" mail (through a real SMTP server on loopback) and webhook (a real receiver on loopback,
checking the signature) from the gpu-pool service within seconds of the server being ready
(issue 39)."""

from __future__ import annotations

import statistics
import threading
import time

import pytest
import requests

from spawner.notify import directory
from spawner.pool.ledger import outbox

from ..fixtures.hub import wait_for
from ..fixtures.webhook import WebhookReceiver

pytest.importorskip("aiosmtpd.controller")
from ..fixtures.smtp import SMTPServer  # noqa: E402

ADDRESS = "gus@example.org"
ROUNDS = 3
SECRET = "a-webhook-secret-of-this-test-deployment"


def config(port: int, secret_file: str = "", allowed: str = "") -> str:
    return f"""
c.EmailNotifications.enabled = True
c.EmailNotifications.smtp_host = "127.0.0.1"
c.EmailNotifications.smtp_port = {port}
c.EmailNotifications.security = "none"
c.EmailNotifications.from_address = "GPU hub <gpu-hub@example.org>"
c.EmailNotifications.public_url = "https://hub.example.org"
c.EmailNotifications.mails_per_hour = 10
c.WebhookNotifications.allowed_urls = {[allowed] if allowed else []!r}
c.WebhookNotifications.secret_file = {secret_file!r}
"""


class ReadyWatch:
    """When the hub's model of a server first says `ready` (polled every 0.1 s in a thread): the
    moment the ready mail's latency is measured from (it is at most this late)."""

    def __init__(self, hub, user: str):
        self.hub, self.user, self.at = hub, user, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set() and self.at is None:
            try:
                server = self.hub.server_model(self.user)
            except requests.RequestException:
                server = None
            if server and server.get("ready"):
                self.at = time.time()
            self._stop.wait(0.1)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(10)


def test_a_queued_spawn_gets_its_ready_mail_and_webhook_within_seconds_of_being_ready(make_hub, capsys, tmp_path):
    secret = tmp_path / "webhook-secret"
    secret.write_text(SECRET + "\n")
    with SMTPServer() as smtp, WebhookReceiver(SECRET.encode()) as receiver:
        hub = make_hub(config(smtp.port, str(secret), receiver.url + "/hooks/"))
        for user in ("eve", "fay", "gus"):
            hub.create_user(user)
        token = hub.user_token("gus")
        api = f"{hub.url}/services/gpu-pool/api/notifications"
        auth = {"Authorization": f"token {token}"}

        def page_up():
            try:
                return requests.get(api, headers=auth, timeout=10).status_code == 200
            except requests.RequestException:
                return False
        wait_for(page_up, timeout=60, what="the gpu-pool service", hub=hub)
        # gus's address as the directory's login would have recorded it (auth_state's mail), and
        # his choices, through the service's API: a mail and a webhook even for a short wait.
        directory.record_address(hub.ledger(), "gus", {"user_attributes": {"mail": [ADDRESS]}})
        # A webhook off the admin's allow-list (the hub's own API here) is refused, naming the list.
        r = requests.put(api, json={"events": {}, "webhook": hub.url + "/hub/api/users"}, headers=auth, timeout=10)
        assert r.status_code == 400 and "allow-list" in r.json()["message"], r.text
        r = requests.put(api, json={"events": {"granted": {"email": "always", "webhook": "always"}},
                                    "webhook": receiver.url + "/hooks/gus"}, headers=auth, timeout=10)
        assert r.status_code == 200, r.text
        assert r.json()["address"] == ADDRESS and r.json()["channels"]["email"]["enabled"] is True
        assert r.json()["webhook"] == receiver.url + "/hooks/gus"

        hub.start_server("fay", {"profile": "tf-gpu-2"})
        to_mail, to_hook, from_grant = [], [], []
        for n in range(1, ROUNDS + 1):
            hub.start_server("eve", {"profile": "tf-gpu-2"})  # the pool is full
            r = hub.api("POST", "/users/gus/server", json={"profile": "tf-gpu-1"})
            assert r.status_code == 202, r.text  # queued
            wait_for(lambda: hub.ledger().queue(), timeout=30, what="gus in the queue", hub=hub)
            assert len(smtp.inbox.messages) == n - 1 and len(receiver.deliveries) == n - 1  # nothing before
            with ReadyWatch(hub, "gus") as ready:
                hub.stop_server("eve")  # the grant
                wait_for(lambda n=n: len(smtp.inbox.messages) == n and len(receiver.deliveries) == n, timeout=60,
                         what=f"mail and webhook {n}", hub=hub)
            assert ready.at is not None, "the mail came before the hub said the server was ready"
            # The newest e-mail row: each event has a row per channel (e-mail, webhook, browser).
            # The SMTP server holds the mail before the sender has its answer and marks the row
            # `sent` (a fresh run read it `sending` in between): wait for the mark.
            def newest_mail_row():
                rows = [e for e in hub.ledger()._store.read(lambda conn: outbox.entries(conn, "gus", 10))
                        if e["channel"] == "email"]
                return rows[0] if rows and rows[0]["state"] != "sending" else None
            event = wait_for(newest_mail_row, timeout=30, what="the mailed row marked", hub=hub)
            assert event["event"] == "granted" and event["state"] == "sent", event
            to_mail.append(smtp.inbox.received_at[-1] - ready.at)
            to_hook.append(receiver.deliveries[-1].received_at - ready.at)
            from_grant.append(smtp.inbox.received_at[-1] - event["created_at"].timestamp())
            hub.stop_server("gus")

        to, msg = smtp.inbox.messages[0]
        assert to == [ADDRESS] and msg["To"] == ADDRESS
        assert msg["Subject"] == "GPU hub: Your GPU is ready: your server (default) is running"
        assert "https://hub.example.org/user/gus/" in msg.get_body(("plain",)).get_content()
        assert msg["List-Unsubscribe"].startswith("<https://hub.example.org/services/gpu-pool/notifications/")
        hook = receiver.deliveries[0]
        assert hook.signed and hook.path == "/hooks/gus", hook.headers
        assert hook.body["text"].startswith("*Your GPU is ready") and hook.body["gpuhub"]["kinds"] == ["granted"]
        assert max(to_mail) < 10 and max(to_hook) < 10, (to_mail, to_hook)
        with capsys.disabled():
            print(f"\nready (as the hub's model first said) -> delivered, {ROUNDS} rounds: mail median "
                  f"{statistics.median(to_mail):.3f} s {[round(x, 3) for x in to_mail]}, webhook median "
                  f"{statistics.median(to_hook):.3f} s {[round(x, 3) for x in to_hook]}; grant -> mail median "
                  f"{statistics.median(from_grant):.3f} s")
