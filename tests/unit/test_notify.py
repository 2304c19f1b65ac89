"""Notifications outside the tab (issue 39): the ledger's outbox, the e-mail sender against a real
SMTP server on loopback (aiosmtpd), preferences, rate limits and hostile input."""

from __future__ import annotations

import asyncio
import email
import email.policy
import socket
import subprocess
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from devservices.waiting import async_until
from spawner.inventory import SimulatedInventory
from spawner.notify import EmailNotifications, directory, preferences, signing
from spawner.notify.message import header_safe
from spawner.notify.sender import Sender
from spawner.pool import GPUPool
from spawner.pool.ledger import outbox
from spawner.pool.ledger.job_records import JobLedger

aiosmtpd = pytest.importorskip("aiosmtpd.controller")

ADDRESS = "bob@example.org"
AUTH_STATE = {"user_attributes": {"mail": [ADDRESS]}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Inbox:
    """What a real SMTP server on loopback received."""

    def __init__(self):
        self.messages: list = []  # (envelope recipients, parsed message)

    async def handle_DATA(self, server, session, envelope):
        msg = email.message_from_bytes(envelope.original_content or envelope.content, policy=email.policy.default)
        self.messages.append((list(envelope.rcpt_tos), msg))
        return "250 OK"


class SMTPServer:
    def __init__(self, port: int | None = None, **kwargs):
        self.inbox = Inbox()
        self.port = port or free_port()
        self.controller = aiosmtpd.Controller(self.inbox, hostname="127.0.0.1", port=self.port, **kwargs)

    def __enter__(self):
        self.controller.start()
        return self

    def __exit__(self, *exc):
        self.controller.stop()


@pytest.fixture
def smtp_server():
    with SMTPServer() as server:
        yield server


class Clock:
    def __init__(self):
        self.now = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)

    def __call__(self):
        return self.now

    def advance(self, seconds: float):
        self.now += timedelta(seconds=seconds)


def make_pool(where, gpus: int = 1, **kwargs) -> GPUPool:
    """A pool on an SQLite file in the directory `where`, or on the database URL `where`
    (tests/integration/test_notify_postgres.py runs these scenarios on PostgreSQL)."""
    url = where if isinstance(where, str) else f"sqlite:///{where / 'ledger.sqlite'}"
    return GPUPool(inventory=SimulatedInventory(count=gpus, host="node-1"), db_url=url, poll_interval=0.05, **kwargs)


def settings(port: int, **kwargs) -> EmailNotifications:
    values = dict(enabled=True, smtp_host="127.0.0.1", smtp_port=port, security="none",
                  from_address="GPU hub <gpu-hub@example.org>", public_url="https://hub.example.org",
                  timeout=2.0, retry_delay=0.2, poll_interval=0.05)
    values.update(kwargs)
    return EmailNotifications(**values)


class ReadyHub:
    """The hub's REST API as the senders ask it whether a granted server is ready: every server
    holding a lease in the pool is, at /user/<name>/<server>/ (the real hub: tests/integration)."""

    def __init__(self, pool, ready: bool = True):
        self.pool, self.ready, self.asked = pool, ready, 0

    async def servers_of_user(self, name: str):
        from spawner.services.hub_api import Server

        self.asked += 1
        return [Server(user=name, name=le.server_name, ready=self.ready, lease_id=le.id,
                       url=f"/user/{name}/{le.server_name}" + ("/" if le.server_name else ""))
                for le in self.pool.leases(name)]


def sender(pool, port: int, owner: str | None = None, hub=None, **kwargs) -> Sender:
    return Sender(pool, settings(port, **kwargs), "/services/gpu-pool/", "http://127.0.0.1:8000/", owner=owner,
                  hub=hub or ReadyHub(pool))


def rows(pool, user: str | None = None, channels: tuple[str, ...] = (outbox.EMAIL, outbox.WEBHOOK)) -> list[dict]:
    """The outbox's rows of these channels (each event also has a browser row: test_notify_browser.py)."""
    return [r for r in pool._store.read(lambda conn: outbox.entries(conn, user)) if r["channel"] in channels]


def outbox_states(pool) -> str:
    """Each e-mail row's state, tries and last error: what a failed count is explained by."""
    return "\n".join(f"{r['id']} {r['event']} {r['state']} attempts={r['attempts']} next_at={r['next_at']} "
                     f"{r['error'] or ''}"
                     for r in rows(pool, channels=(outbox.EMAIL,)))


def always(pool, user: str = "bob") -> None:
    directory.set_preferences(pool, user, '{"granted": {"email": "always"}, "job-ended": {"email": "always"}}')


async def queued_grant(pool) -> None:
    """bob waits behind alice for the pool's one GPU, and gets it when she stops."""
    held = pool.try_acquire("alice", "", 1)
    task = asyncio.ensure_future(pool.acquire("bob", "train", 1, timeout=30))
    await async_until(lambda: pool.queue(), what="bob queued")
    pool.release(held.id, "stopped")
    await task


def test_a_queued_grant_writes_its_event_with_the_lease_and_is_mailed_once(tmp_path, smtp_server):
    a_queued_grant_writes_its_event_with_the_lease_and_is_mailed_once(tmp_path, smtp_server)


def a_queued_grant_writes_its_event_with_the_lease_and_is_mailed_once(tmp_path, smtp_server):
    pool = make_pool(tmp_path)
    directory.record_address(pool, "bob", AUTH_STATE)
    always(pool)
    pool.try_acquire("carol", "", 1) and None  # a grant without a wait tells nothing
    assert rows(pool) == []
    pool.release(pool.leases("carol")[0].id)

    async def main():
        await queued_grant(pool)
        [event] = rows(pool)
        assert (event["user_name"], event["event"], event["state"]) == ("bob", "granted", "pending")
        assert event["payload"]["server_name"] == "train" and event["payload"]["gpus"] == 1
        first, second = sender(pool, smtp_server.port), sender(pool, smtp_server.port, )
        # Two senders at once (two service processes): the mail goes once.
        sent = await asyncio.gather(first.run_once(), second.run_once())
        assert sorted(sent) == [0, 1]
        assert await first.run_once() == 0
        await first.stop()
        await second.stop()

    asyncio.run(main())
    [(to, msg)] = smtp_server.inbox.messages
    assert to == [ADDRESS] and msg["To"] == ADDRESS
    assert msg["Subject"] == "GPU hub: Your GPU is ready: your server train is running"
    assert msg["Auto-Submitted"] == "auto-generated"
    assert msg["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    assert msg["List-Unsubscribe"].startswith("<https://hub.example.org/services/gpu-pool/notifications/unsubscribe?")
    text = msg.get_body(("plain",)).get_content()
    assert "Waited in the queue" in text and "https://hub.example.org/user/bob/train/" in text
    assert msg.get_body(("html",)) is not None
    [event] = rows(pool)
    assert event["state"] == "sent" and event["mail_id"] == msg["Message-ID"]
    pool.close()


def test_a_job_end_is_told_with_state_exit_code_gpu_hours_and_its_log_and_html_is_escaped(tmp_path, smtp_server):
    pool = make_pool(tmp_path)
    directory.record_address(pool, "bob", AUTH_STATE)
    always(pool)
    jobs = JobLedger(pool)
    job = jobs.create("bob", [], "tf-gpu-1", ["python", "-c", "print('<script>alert(1)</script>')"], ".", 600,
                      "node-1", 1000, 1000)
    jobs.update(job.id, ("queued",), "started_at", state="running", gpu_uuids=["GPU-1", "GPU-2"])
    assert rows(pool) == []  # running is no end
    jobs.update(job.id, ("running",), "ended_at", state="failed", exit_code=3, message="exited with 3")
    jobs.update(job.id, ("running",), "ended_at", state="failed", exit_code=3)  # already ended: no second event
    [event] = rows(pool)
    assert event["event"] == "job-ended"
    assert {k: event["payload"][k] for k in ("job_id", "state", "exit_code")} == {
        "job_id": job.id, "state": "failed", "exit_code": 3}
    assert asyncio.run(sender(pool, smtp_server.port).run_once()) == 1
    [(_, msg)] = smtp_server.inbox.messages
    assert msg["Subject"] == f"GPU hub: Your job {job.id} ended: failed"
    html = msg.get_body(("html",)).get_content()
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    text = msg.get_body(("plain",)).get_content()
    assert "Exit code: 3" in text and "GPU-hours: 0.000" in text
    assert f"https://hub.example.org/services/gpu-pool/jobs/{job.id}" in text
    pool.close()


def test_cr_lf_in_names_and_commands_add_no_header(tmp_path, smtp_server):
    pool = make_pool(tmp_path)
    directory.record_address(pool, "bob", AUTH_STATE)
    always(pool)
    jobs = JobLedger(pool)
    job = jobs.create("bob", [], "p", ["echo", "x\r\nBcc: evil@example.com\r\n\r\nbody"], ".", 60, "node-1", 1, 1)
    jobs.update(job.id, ("queued",), "ended_at", state="cancelled", message="Subject: x\r\nBcc: evil@example.com")
    s = sender(pool, smtp_server.port, from_address="GPU hub\r\nBcc: evil@example.com <gpu-hub@example.org>")
    assert asyncio.run(s.run_once()) == 1
    [(to, msg)] = smtp_server.inbox.messages
    assert to == [ADDRESS] and msg["Bcc"] is None
    assert all("\n" not in v and "\r" not in v for v in msg.values())
    assert header_safe("a\r\nBcc: x\u2028y") == "a Bcc: x y"
    # A directory address with a line break in it is no address.
    assert directory.address_of({"user_attributes": {"mail": "bob@example.org\r\nBcc: evil@example.com"}}) is None
    pool.close()


def test_a_dead_smtp_server_is_retried_with_backoff_then_the_mail_goes_once(tmp_path):
    pool = make_pool(tmp_path)
    directory.record_address(pool, "bob", AUTH_STATE)
    always(pool)
    port = free_port()  # nothing listens yet

    async def main():
        await queued_grant(pool)
        s = sender(pool, port, retry_delay=0.3)
        assert await s.run_once() == 0
        [event] = rows(pool)
        assert (event["state"], event["attempts"]) == ("pending", 1)
        assert "ConnectionRefusedError" in event["error"]
        assert await s.run_once() == 0 and rows(pool)[0]["attempts"] == 1  # not due yet: the backoff
        with SMTPServer(port) as server:
            await async_until(lambda: s.run_once(), what="the retry sent")
            assert await s.run_once() == 0
            assert len(server.inbox.messages) == 1
        await s.stop()
        return rows(pool)[0]

    event = asyncio.run(main())
    assert (event["state"], event["attempts"]) == ("sent", 2)
    pool.close()


def test_retries_end_after_max_attempts(tmp_path):
    pool = make_pool(tmp_path)
    directory.record_address(pool, "bob", AUTH_STATE)
    always(pool)

    async def main():
        await queued_grant(pool)
        s = sender(pool, free_port(), retry_delay=0.05, max_attempts=2)

        async def given_up():
            await s.run_once()
            return rows(pool)[0]["state"] == "failed"
        await async_until(given_up, what="given up")

    asyncio.run(main())
    assert rows(pool)[0]["attempts"] == 2
    pool.close()


def test_events_past_the_age_bound_are_dropped_not_sent(tmp_path, smtp_server):
    clock = Clock()
    pool = make_pool(tmp_path, clock=clock)
    directory.record_address(pool, "bob", AUTH_STATE)
    always(pool)
    jobs = JobLedger(pool)
    job = jobs.create("bob", [], "p", ["true"], ".", 60, "node-1", 1, 1)
    jobs.update(job.id, ("queued",), "ended_at", state="cancelled")
    clock.advance(3601)
    assert asyncio.run(sender(pool, smtp_server.port, max_age=3600).run_once()) == 0
    assert rows(pool)[0]["state"] == "expired" and smtp_server.inbox.messages == []
    pool.close()


def test_after_a_crash_unsent_claims_are_sent_and_half_sent_ones_never_again(tmp_path, smtp_server):
    after_a_crash_unsent_claims_are_sent_and_half_sent_ones_never_again(tmp_path, smtp_server)


def after_a_crash_unsent_claims_are_sent_and_half_sent_ones_never_again(tmp_path, smtp_server):
    clock = Clock()
    pool = make_pool(tmp_path, clock=clock)
    directory.record_address(pool, "bob", AUTH_STATE)
    always(pool)
    jobs = JobLedger(pool)
    for _ in range(3):
        job = jobs.create("bob", [], "p", ["true"], ".", 60, "node-1", 1, 1)
        jobs.update(job.id, ("queued",), "ended_at", state="cancelled")
    store = pool._store
    # A sender claimed two, began sending one of them, and died; the third was never claimed.
    claimed = store.write(lambda conn: outbox.claim(store, conn, "dead-host:1", "email", 2))
    store.write(lambda conn: outbox.begin(store, conn, [claimed[0].id]))
    clock.advance(30)
    s = sender(pool, smtp_server.port, stuck_after=60)
    assert asyncio.run(s.run_once()) == 1  # the pending one (a restart sends what was pending)
    assert [r["state"] for r in sorted(rows(pool), key=lambda r: r["id"])] == ["sending", "claimed", "sent"]
    clock.advance(60)
    assert asyncio.run(s.run_once()) == 1
    states = [r["state"] for r in sorted(rows(pool), key=lambda r: r["id"])]
    assert states == ["unknown", "sent", "sent"]  # at most once: the half-sent one is never repeated
    assert len(smtp_server.inbox.messages) == 2
    pool.close()


def test_a_stopping_sender_gives_back_what_it_claimed_and_never_began(tmp_path, smtp_server):
    pool = make_pool(tmp_path)
    directory.record_address(pool, "bob", AUTH_STATE)
    always(pool)
    jobs = JobLedger(pool)
    job = jobs.create("bob", [], "p", ["true"], ".", 60, "node-1", 1, 1)
    jobs.update(job.id, ("queued",), "ended_at", state="cancelled")
    first = sender(pool, smtp_server.port)
    store = pool._store

    async def main():
        first._task = asyncio.create_task(asyncio.sleep(3600))  # a running sender, stopped below
        store.write(lambda conn: outbox.claim(store, conn, first.owner, "email", 10))
        await first.stop()
        assert (rows(pool)[0]["state"], rows(pool)[0]["attempts"]) == ("pending", 0)
        assert await sender(pool, smtp_server.port, owner="next:2").run_once() == 1  # at once, not after stuck_after

    asyncio.run(main())
    assert len(smtp_server.inbox.messages) == 1
    pool.close()


def test_a_flood_of_job_ends_becomes_a_digest_within_the_hourly_limit(tmp_path, smtp_server):
    a_flood_of_job_ends_becomes_a_digest_within_the_hourly_limit(tmp_path, smtp_server)


def a_flood_of_job_ends_becomes_a_digest_within_the_hourly_limit(tmp_path, smtp_server):
    clock = Clock()
    pool = make_pool(tmp_path, clock=clock)
    directory.record_address(pool, "bob", AUTH_STATE)
    always(pool)
    jobs = JobLedger(pool)
    # A generous SMTP timeout: the test counts mails, and an answer to DATA later than the usual
    # 2 s (a loaded machine) makes the sender give the mail up as `unknown` (at most once) while
    # the server holds it, so the counts differ (a helper's loaded run; shown with a server whose
    # first answer came after 2.5 s).
    s = sender(pool, smtp_server.port, mails_per_hour=2, timeout=30.0)

    def end_one():
        job = jobs.create("bob", [], "p", ["true"], ".", 60, "node-1", 1, 1)
        jobs.update(job.id, ("queued",), "ended_at", state="cancelled")

    async def main():
        for _ in range(40):
            end_one()
            await s.run_once()
            clock.advance(1)
        # the limit; else the outbox says why
        assert len(smtp_server.inbox.messages) == 2, outbox_states(pool)
        clock.advance(3600)
        await s.run_once()

    asyncio.run(main())
    assert len(smtp_server.inbox.messages) == 3, outbox_states(pool)
    digest = smtp_server.inbox.messages[-1][1]
    assert digest["Subject"] == "GPU hub: 38 updates about your GPUs and jobs"
    assert {r["state"] for r in rows(pool)} == {"sent"}
    pool.close()


def test_auto_tells_only_long_waits_and_long_jobs_and_no_address_means_no_mail(tmp_path, smtp_server):
    ready_after = 30.0
    assert preferences.wants(preferences.defaults(), "granted", "email", {"waited_s": 29}, ready_after) is False
    assert preferences.wants(preferences.defaults(), "granted", "email", {"waited_s": 30}, ready_after) is True
    assert preferences.wants(preferences.defaults(), "job-ended", "email", {"ran_s": 301}, ready_after) is True
    assert preferences.wants(preferences.defaults(), "job-ended", "email", {"ran_s": 10}, ready_after) is False
    assert preferences.wants(preferences.defaults(), "cull-warning", "email", {}, ready_after) is True
    pool = make_pool(tmp_path)
    jobs = JobLedger(pool)
    job = jobs.create("bob", [], "p", ["true"], ".", 60, "node-1", 1, 1)
    jobs.update(job.id, ("queued",), "ended_at", state="cancelled")
    assert asyncio.run(sender(pool, smtp_server.port).run_once()) == 0
    assert rows(pool)[0]["state"] == "skipped"  # a short job: the default tells nothing
    always(pool)
    job = jobs.create("bob", [], "p", ["true"], ".", 60, "node-1", 1, 1)
    jobs.update(job.id, ("queued",), "ended_at", state="cancelled")
    assert asyncio.run(sender(pool, smtp_server.port).run_once()) == 0
    assert "no address" in rows(pool)[0]["error"]
    assert smtp_server.inbox.messages == []
    pool.close()


@pytest.mark.parametrize("body, says", [
    (b"not json", "must be JSON"),
    (b"[]", 'the keys "events" and (optional) "webhook"'),
    (b'{"events": {"granted": {"email": "sometimes"}}}', "events.granted.email must be one of auto, always, never"),
    (b'{"events": {"reboot": {}}}', "unknown event 'reboot'"),
    (b'{"events": {"granted": {"pigeon": "always"}}}', "unknown channel 'pigeon'"),
    (b'{"events": {"granted": ["email"]}}', "must be an object"),
    (b'{"events": {}, "admin": true}', 'the keys "events" and (optional) "webhook"'),
    (b'{"events": {}, "webhook": 7}', '"webhook" must be a URL'),
    (b'{"events": {"granted": {"email": "' + b"x" * 5000 + b'"}}}', "over 4096 bytes"),
])
def test_bad_preferences_are_refused_saying_what_is_wrong(body, says):
    with pytest.raises(preferences.BadPreferences, match=None) as e:
        preferences.parse(body)
    assert says in str(e.value)


def test_preferences_left_out_keep_their_default():
    assert preferences.parse(b'{"events": {"granted": {"email": "never"}}}') == {
        "granted": {"email": "never", "webhook": "auto", "browser": "auto"},
        "job-ended": {"email": "auto", "webhook": "auto", "browser": "auto"},
        "cull-warning": {"email": "auto", "webhook": "auto", "browser": "auto"},
        "reclaimed": {"email": "auto", "webhook": "auto", "browser": "auto"},
        "budget": {"email": "auto", "webhook": "auto", "browser": "auto"},
        "booking": {"email": "auto", "webhook": "auto", "browser": "auto"},
        "booked-out": {"email": "auto", "webhook": "auto", "browser": "auto"}}


def test_unsubscribe_tokens_are_per_user_and_event():
    key = b"k" * 32
    t = signing.token(key, "bob", "granted")
    assert signing.valid(key, "bob", "granted", t)
    assert not signing.valid(key, "alice", "granted", t)
    assert not signing.valid(key, "bob", "job-ended", t)
    assert not signing.valid(b"x" * 32, "bob", "granted", t)


def test_the_smtp_password_is_never_logged_nor_in_the_outbox(tmp_path, caplog):
    secret = tmp_path / "pw"
    secret.write_text("hunter2-very-secret\n")
    pool = make_pool(tmp_path)
    directory.record_address(pool, "bob", AUTH_STATE)
    always(pool)
    jobs = JobLedger(pool)
    job = jobs.create("bob", [], "p", ["true"], ".", 60, "node-1", 1, 1)
    jobs.update(job.id, ("queued",), "ended_at", state="cancelled")
    with SMTPServer(auth_require_tls=False, auth_required=True,
                    authenticator=lambda *a: __import__("aiosmtpd.smtp").smtp.AuthResult(success=False)) as server:
        s = sender(pool, server.port, username="bob", password_file=str(secret), security="none")
        assert s.settings.problems()  # "none" with a login is refused up front...
        caplog.set_level("DEBUG")
        asyncio.run(s.run_once())  # ...and a refused login is said without the password
    assert "hunter2" not in caplog.text
    assert all("hunter2" not in (r["error"] or "") for r in rows(pool))
    pool.close()


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem")],
                   check=True, capture_output=True)
    return d / "cert.pem", d / "key.pem"


def test_starttls_is_used_and_the_certificate_checked(tmp_path, certificate):
    import ssl

    cert, key = certificate
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(cert), str(key))
    pool = make_pool(tmp_path)
    directory.record_address(pool, "bob", AUTH_STATE)
    always(pool)
    jobs = JobLedger(pool)
    job = jobs.create("bob", [], "p", ["true"], ".", 60, "node-1", 1, 1)
    jobs.update(job.id, ("queued",), "ended_at", state="cancelled")
    with SMTPServer(tls_context=context, require_starttls=True) as server:
        # An unknown CA: refused, nothing sent, retried later.
        assert asyncio.run(sender(pool, server.port, security="starttls").run_once()) == 0
        assert "CERTIFICATE_VERIFY_FAILED" in rows(pool)[0]["error"]
        assert server.inbox.messages == []
        trusting = sender(pool, server.port, security="starttls", ca_file=str(cert), retry_delay=0.05)

        async def main():
            await async_until(lambda: trusting.run_once(), what="sent over STARTTLS")
        asyncio.run(main())
        assert len(server.inbox.messages) == 1
    pool.close()


def test_a_version_11_ledger_gains_the_outbox_in_place(tmp_path):
    from spawner.pool import SCHEMA_VERSION

    url = f"sqlite:///{tmp_path / 'old.sqlite'}"
    GPUPool(db_url=url).gpus()
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE gpu_pool_outbox"))
        conn.execute(sa.text("DROP TABLE gpu_pool_notify_users"))
        conn.execute(sa.text("UPDATE gpu_pool_meta SET value='11' WHERE key='schema_version'"))
    p = GPUPool(db_url=url)
    jobs = JobLedger(p)
    job = jobs.create("bob", [], "p", ["true"], ".", 60, "node-1", 1, 1)
    jobs.update(job.id, ("queued",), "ended_at", state="cancelled")
    assert [r["event"] for r in rows(p)] == ["job-ended"]
    with engine.begin() as conn:
        assert conn.execute(sa.text("SELECT value FROM gpu_pool_meta WHERE key='schema_version'")).scalar() \
            == str(SCHEMA_VERSION) == "14"
    p.close()
    engine.dispose()


# --- the API and the unsubscribe links -------------------------------------------------------------


@pytest.fixture
def service(tmp_path):
    """The pool service's app on a free port; the hub's login stood in for by a header."""
    import requests  # noqa: F401

    from tests.fixtures.pool_app import serving_app

    def current_user(self):
        name = self.request.headers.get("X-User")
        return {"name": name, "scopes": [], "kind": "user", "groups": []} if name else None

    pool = make_pool(tmp_path)
    with serving_app(pool, current_user) as url:
        yield url, pool
    pool.close()


def test_choices_are_read_and_set_and_bad_ones_change_nothing(service):
    import requests

    url, pool = service
    api = url + "api/notifications"
    r = requests.get(api, headers={"X-User": "bob"}, timeout=10)
    assert r.status_code == 200
    assert r.json()["events"] == preferences.defaults()
    assert r.json()["address"] is None and r.json()["channels"] == {
        "email": {"enabled": False}, "webhook": {"enabled": False, "allowed": []},
        "browser": {"enabled": True, "poll_interval_s": 5.0}}
    assert requests.get(api, timeout=10).status_code == 403
    r = requests.put(api, data='{"events": {"granted": {"email": "always"}}}', headers={"X-User": "bob"}, timeout=10)
    assert r.status_code == 200 and r.json()["events"]["granted"] == {"email": "always", "webhook": "auto",
                                                                      "browser": "auto"}
    for body, status, says in [('{"events": {"granted": {"email": "loud"}}}', 400, "must be one of auto"),
                               ("{", 400, "must be JSON"), ("x" * 5000, 413, "over 4096 bytes")]:
        r = requests.put(api, data=body, headers={"X-User": "bob"}, timeout=10)
        assert (r.status_code, says in r.json()["message"]) == (status, True), r.text
    assert requests.get(api, headers={"X-User": "bob"}, timeout=10).json()["events"]["granted"]["email"] == "always"
    # Another user's choices are theirs: bob's PUT changed nothing of carol's.
    assert requests.get(api, headers={"X-User": "carol"}, timeout=10).json()["events"]["granted"]["email"] == "auto"


def test_puts_are_rate_limited_per_user(service):
    import requests

    url, _ = service
    api = url + "api/notifications"
    codes = [requests.put(api, data='{"events": {}}', headers={"X-User": "dave"}, timeout=10).status_code
             for _ in range(21)]
    assert codes[:20] == [200] * 20 and codes[20] == 429
    assert requests.put(api, data='{"events": {}}', headers={"X-User": "erin"}, timeout=10).status_code == 200


def test_the_mails_unsubscribe_link_stops_that_event_only(service, smtp_server):
    import re
    from urllib.parse import urlsplit

    import requests

    url, pool = service
    directory.record_address(pool, "bob", AUTH_STATE)
    always(pool)
    jobs = JobLedger(pool)
    job = jobs.create("bob", [], "p", ["true"], ".", 60, "node-1", 1, 1)
    jobs.update(job.id, ("queued",), "ended_at", state="cancelled")
    base = url.split("/services/")[0]
    assert asyncio.run(Sender(pool, settings(smtp_server.port, public_url=base), "/services/gpu-pool/", "",
                              hub=ReadyHub(pool)).run_once()) == 1
    [(_, msg)] = smtp_server.inbox.messages
    link = re.search(r"<([^>]+)>", msg["List-Unsubscribe"]).group(1)
    assert urlsplit(link).path == "/services/gpu-pool/notifications/unsubscribe"
    page = requests.get(link, timeout=10)
    assert page.status_code == 200 and "Unsubscribe" in page.text
    assert requests.get(url + "api/notifications", headers={"X-User": "bob"}, timeout=10).json()["events"][
        "job-ended"]["email"] == "always"  # a GET (a link scanner) changes nothing
    forged = link.replace("user=bob", "user=carol")
    assert requests.post(forged, data="List-Unsubscribe=One-Click", timeout=10).status_code == 403
    done = requests.post(link, data="List-Unsubscribe=One-Click", timeout=10)  # RFC 8058's one click
    assert done.status_code == 200 and "no more mails about" in done.text
    events = requests.get(url + "api/notifications", headers={"X-User": "bob"}, timeout=10).json()["events"]
    assert {e: c["email"] for e, c in events.items()} == {"granted": "always", "job-ended": "never",
                                                          "cull-warning": "auto", "reclaimed": "auto",
                                                          "budget": "auto", "booking": "auto", "booked-out": "auto"}
    assert requests.get(link.split("&token")[0], timeout=10).status_code == 403
