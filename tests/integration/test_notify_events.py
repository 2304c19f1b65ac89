"""Notifications against a real hub, its idle culler and a real SMTP server on loopback (issue 39):
a cull warning whose "keep it" link counts as activity the culler reads (for its owner's server
only, until it expires), and the outbox surviving a SIGKILL of the hub and its service."""

from __future__ import annotations

import os
import signal
from datetime import UTC, datetime
from urllib.parse import urlsplit

import pytest
import requests

from spawner.notify import directory, signing
from spawner.pool.ledger import outbox

from ..fixtures.hub import wait_for
from ..fixtures.services import free_port
from .test_poolpage_scripts import service_pid

pytest.importorskip("aiosmtpd.controller")
from ..fixtures.smtp import SMTPServer  # noqa: E402

ADDRESS = "gus@example.org"
IDLE_LIMIT = 60  # the culler's, for GPU servers
# The warning comes after 20 s idle, so the keep link is followed at least 20 s into the spell: the
# kept server's new deadline is that much after the first one, past the culler rounds waited for.
WARN_BEFORE = 40


def mail_config(port: int, **extra) -> str:
    lines = [
        "c.EmailNotifications.enabled = True",
        'c.EmailNotifications.smtp_host = "127.0.0.1"',
        f"c.EmailNotifications.smtp_port = {port}",
        'c.EmailNotifications.security = "none"',
        'c.EmailNotifications.from_address = "GPU hub <gpu-hub@example.org>"',
        'c.EmailNotifications.public_url = "https://hub.example.org"',
    ]
    lines += [f"c.{k.replace('__', '.')} = {v!r}" for k, v in extra.items()]
    return "\n".join(lines) + "\n"


def rows(hub, user: str = "gus", event: str | None = None) -> list[dict]:
    """The rows of the mails and webhooks (each event also has a browser row)."""
    found = hub.ledger()._store.read(lambda conn: outbox.entries(conn, user))
    return [r for r in found if (event is None or r["event"] == event) and r["channel"] != outbox.BROWSER]


def on_hub(hub, link: str) -> str:
    """A link of a mail (written for the hub's public address) as this test reaches the hub."""
    u = urlsplit(link)
    return f"{hub.url}{u.path}?{u.query}"


def service_up(hub, user: str) -> None:
    token = hub.user_token(user)

    def up():
        try:
            return requests.get(f"{hub.url}/services/gpu-pool/api/notifications",
                                headers={"Authorization": f"token {token}"}, timeout=10).status_code == 200
        except requests.RequestException:
            return False
    wait_for(up, timeout=60, what="the gpu-pool service", hub=hub)


def test_an_idle_server_is_warned_once_per_spell_and_its_keep_link_keeps_it(make_hub):
    with SMTPServer() as smtp:
        hub = make_hub(mail_config(smtp.port, Notifications__cull_warning_before=float(WARN_BEFORE),
                                   Notifications__cull_check_every=1.0),
                       env={"GPUHUB_CULL": "true", "GPUHUB_CULL_EVERY": "1", "GPUHUB_CULL_TIMEOUT_GPU": str(IDLE_LIMIT),
                            "GPUHUB_CULL_TIMEOUT_CPU": "600"})
        for user in ("gus", "eve"):
            hub.create_user(user)
        service_up(hub, "gus")
        directory.record_address(hub.ledger(), "gus", {"user_attributes": {"mail": [ADDRESS]}})  # defaults otherwise
        hub.start_server("gus", {"profile": "tf-gpu-1"})
        wait_for(lambda: smtp.inbox.messages, timeout=IDLE_LIMIT, what="the cull warning", hub=hub)
        to, msg = smtp.inbox.messages[0]
        assert to == [ADDRESS] and "will be stopped in" in msg["Subject"] and "idle" in msg["Subject"], msg["Subject"]
        text = msg.get_body(("plain",)).get_content()
        assert "https://hub.example.org/user/gus/" in text
        link = next(w for w in text.split() if "/notifications/keep?" in w)
        [warned] = rows(hub, event="cull-warning")
        first_deadline = datetime.fromisoformat(warned["payload"]["deadline"])
        spell = warned["payload"]["spell"]

        # Hostile: gus's link altered to name eve's server, and a link signed with a past expiry.
        forged = requests.post(on_hub(hub, link).replace("user=gus", "user=eve"), timeout=30)
        assert forged.status_code == 403 and "another user" in forged.text, forged.text
        key = directory.secret(hub.ledger())
        old = signing.keep_url(key, "https://hub.example.org", "/services/gpu-pool/", "gus", "",
                               int(datetime.now(UTC).timestamp()) - 60)
        expired = requests.post(on_hub(hub, old), timeout=30)
        assert expired.status_code == 410 and "expired at" in expired.text, expired.text
        assert hub.server_model("gus")["last_activity"] is not None

        page = requests.get(on_hub(hub, link), timeout=30)
        assert page.status_code == 200 and "Keep it running" in page.text
        kept = requests.post(on_hub(hub, link), timeout=30)
        assert kept.status_code == 200 and "Kept" in kept.text, kept.text
        activity = datetime.fromisoformat(hub.server_model("gus")["last_activity"].replace("Z", "+00:00"))
        assert activity > datetime.fromisoformat(spell)  # the hub (and so its culler) heard of it

        # Past the deadline it was warned of, the culler keeps it: the link counted as activity.
        wait_for(lambda: datetime.now(UTC) > first_deadline, timeout=IDLE_LIMIT + 10, what="the first deadline",
                 hub=hub)
        hub.wait_cull_rounds(2)
        assert (hub.server_model("gus") or {}).get("ready"), "the kept server was culled at its first deadline"
        # Idle again: a new spell, one new warning (not one per check).
        wait_for(lambda: len(smtp.inbox.messages) >= 2, timeout=IDLE_LIMIT, what="the second spell's warning",
                 hub=hub)
        hub.wait_cull_rounds(2)
        assert len(rows(hub, event="cull-warning")) == 2 and len(smtp.inbox.messages) == 2


def test_a_pending_mail_survives_a_sigkill_of_the_hub_and_its_service_and_goes_once(make_hub):
    port = free_port()  # the SMTP server is down when the event is written
    hub = make_hub(mail_config(port, EmailNotifications__retry_delay=1.0, EmailNotifications__max_attempts=50,
                               EmailNotifications__stuck_after=5.0),
                   env={"GPUHUB_SIMULATED_GPUS": "1"})
    for user in ("eve", "gus"):
        hub.create_user(user)
    service_up(hub, "gus")
    directory.record_address(hub.ledger(), "gus", {"user_attributes": {"mail": [ADDRESS]}})
    directory.set_preferences(hub.ledger(), "gus", '{"events": {"granted": {"email": "always"}}}')
    hub.start_server("eve", {"profile": "tf-gpu-1"})
    r = hub.api("POST", "/users/gus/server", json={"profile": "tf-gpu-1"})
    assert r.status_code == 202, r.text
    wait_for(lambda: hub.ledger().queue(), timeout=30, what="gus in the queue", hub=hub)
    hub.stop_server("eve")
    hub.wait_ready("gus", timeout=120)
    tried = wait_for(lambda: (r := rows(hub, event="granted")) and r[0]["attempts"] >= 1 and r[0]["error"] and r[0],
                     timeout=30, what="the ready mail tried against the dead SMTP server", hub=hub)
    assert tried["state"] in ("pending", "claimed") and "refused" in tried["error"].lower(), tried

    service = service_pid(hub)
    hub.kill()
    os.kill(service, signal.SIGKILL)
    wait_for(lambda: not os.path.exists(f"/proc/{service}"), timeout=30, what="the service gone", hub=hub)
    assert rows(hub, event="granted")[0]["state"] != "sent"

    with SMTPServer(port=port) as smtp:
        hub.start()
        wait_for(lambda: smtp.inbox.messages, timeout=90, what="the mail after the restart", hub=hub)
        done = wait_for(lambda: (r := rows(hub, event="granted")[0])["state"] == "sent" and r, timeout=30,
                        what="the outbox row settled", hub=hub)
        hub.wait_ready("gus", timeout=60)  # the hub took the server up again; the mail was about it
        assert len(smtp.inbox.messages) == 1 and done["mail_id"] == smtp.inbox.messages[0][1]["Message-ID"]
        assert smtp.inbox.messages[0][1]["Subject"] == "GPU hub: Your GPU is ready: your server (default) is running"
        assert len(rows(hub, event="granted")) == 1
