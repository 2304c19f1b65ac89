"""Notifications outside the tab, second slice (issue 39): the "ready" mail held until the hub says
the server is ready, cull warnings with their signed "keep it" link, and webhooks on the admin's
allow-list, against a real SMTP server (aiosmtpd) and a real webhook receiver on loopback."""

from __future__ import annotations

import asyncio
import re
import time
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
import requests

from devservices.waiting import async_until
from spawner.culling.deadline import CullRules
from spawner.notify import directory, signing
from spawner.notify.cull_warning import CullWatch, due
from spawner.notify.settings import Notifications, WebhookNotifications
from spawner.notify.webhook import BadWebhook, WebhookSender, checked_url
from spawner.poolpage.service_config import PoolPageSettings
from spawner.services.hub_api import Server
from tests.fixtures.webhook import WebhookReceiver

from .test_notify import ADDRESS, AUTH_STATE, ReadyHub, SMTPServer, make_pool, queued_grant, rows, sender

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
RULES = CullRules(cpu_timeout=0, gpu_timeout=900)  # GPU servers culled after 15 min idle, CPU never
SECRET = b"s3cret-of-this-deployment"


@pytest.fixture
def smtp_server():
    with SMTPServer() as server:
        yield server


def mail_always(pool, user="bob", event="granted"):
    directory.record_address(pool, user, AUTH_STATE)
    directory.set_preferences(pool, user, f'{{"events": {{"{event}": {{"email": "always"}}}}}}')


# --- "Your GPU is ready" ---------------------------------------------------------------------------


def test_the_grant_is_mailed_once_its_server_is_ready_with_the_servers_link(tmp_path, smtp_server):
    pool = make_pool(tmp_path)
    mail_always(pool)
    hub = ReadyHub(pool, ready=False)

    async def main():
        await queued_grant(pool)
        s = sender(pool, smtp_server.port, hub=hub)
        assert await s.run_once() == 0  # granted, still starting: nothing yet
        assert rows(pool)[0]["state"] == "pending" and rows(pool)[0]["attempts"] == 0  # waiting is no try
        assert smtp_server.inbox.messages == []
        hub.ready = True
        await async_until(s.run_once, what="the mail once the server is ready")
        await s.stop()

    asyncio.run(main())
    [(_, msg)] = smtp_server.inbox.messages
    assert msg["Subject"] == "GPU hub: Your GPU is ready: your server train is running"
    assert "https://hub.example.org/user/bob/train/" in msg.get_body(("plain",)).get_content()
    assert rows(pool)[0]["state"] == "sent"
    pool.close()


def test_a_server_gone_before_it_was_ready_or_a_later_spawn_is_not_told(tmp_path, smtp_server):
    pool = make_pool(tmp_path)
    mail_always(pool)

    class Gone(ReadyHub):
        async def servers_of_user(self, name):
            return []

    class Respawned(ReadyHub):  # ready, but with another lease: a later spawn of the same name
        async def servers_of_user(self, name):
            return [Server(user=name, name="train", ready=True, lease_id=999, url="/user/bob/train/")]

    async def main():
        await queued_grant(pool)
        assert await sender(pool, smtp_server.port, hub=Gone(pool)).run_once() == 0
        assert rows(pool)[0]["state"] == "skipped" and "stopped before it was ready" in rows(pool)[0]["error"]
        pool.release(pool.leases("bob")[0].id)
        await queued_grant(pool)
        assert await sender(pool, smtp_server.port, hub=Respawned(pool)).run_once() == 0
        assert rows(pool)[0]["state"] == "skipped"

    asyncio.run(main())
    assert smtp_server.inbox.messages == []
    pool.close()


def test_by_default_a_ready_server_is_told_only_after_a_wait_of_ready_after(tmp_path, smtp_server):
    pool = make_pool(tmp_path)
    directory.record_address(pool, "bob", AUTH_STATE)  # no choices: the defaults ("auto")

    async def main():
        await queued_grant(pool)  # a wait of well under a second
        long_wait = sender(pool, smtp_server.port)
        long_wait.events = Notifications(ready_after=30)
        assert await long_wait.run_once() == 0
        assert rows(pool)[0]["state"] == "skipped"
        pool.release(pool.leases("bob")[0].id)
        await queued_grant(pool)
        short = sender(pool, smtp_server.port)
        short.events = Notifications(ready_after=0)
        assert await short.run_once() == 1

    asyncio.run(main())
    assert len(smtp_server.inbox.messages) == 1
    pool.close()


# --- cull warnings -------------------------------------------------------------------------------


def gpu_server(idle_s: float, name: str = "train", user: str = "bob", **kw) -> Server:
    values = dict(user=user, name=name, ready=True, last_activity=NOW - timedelta(seconds=idle_s), lease_id=1,
                  url=f"/user/{user}/{name}/", started=NOW - timedelta(hours=1), host="node-1", profile="tf-gpu-1")
    values.update(kw)
    return Server(**values)


def test_a_server_is_due_a_warning_within_the_warning_time_of_its_deadline_only():
    servers = [gpu_server(850, "soon"), gpu_server(100, "later"), gpu_server(950, "past"),
               gpu_server(850, "cpu", lease_id=None), gpu_server(850, "starting", ready=False)]
    assert [(s.name, d.at) for s, d in due(RULES, servers, [], NOW, 600)] == [
        ("soon", NOW + timedelta(seconds=50))]
    # While someone waits for its host, the contended limit holds (the culler's own rule).
    contended = CullRules(0, 900, gpu_contended_timeout=300)
    assert [s.name for s, _ in due(contended, [gpu_server(100, "later")], [None], NOW, 600)] == ["later"]


class ActiveHub:
    def __init__(self, servers):
        self.servers = servers

    async def active_servers(self):
        return self.servers

    async def servers_of_user(self, name):
        return [s for s in self.servers if s.user == name]


def test_one_warning_per_idle_spell_mailed_with_a_keep_link_and_cr_lf_in_names_add_no_header(
        tmp_path, smtp_server):
    pool = make_pool(tmp_path)
    mail_always(pool, event="cull-warning")
    hostile = "train\r\nBcc: evil@example.com"
    hub = ActiveHub([gpu_server(850, hostile, last_activity=datetime.now(UTC) - timedelta(seconds=850))])
    watch = CullWatch(pool, hub, RULES, Notifications())

    async def main():
        assert await watch.run_once() == 1
        assert await watch.run_once() == 0  # the same spell: warned already
        assert await sender(pool, smtp_server.port, hub=hub).run_once() == 1
        hub.servers = [gpu_server(880, hostile, last_activity=datetime.now(UTC) - timedelta(seconds=880))]
        assert await watch.run_once() == 1  # activity began a new spell, idle again since

    asyncio.run(main())
    [(to, msg)] = smtp_server.inbox.messages
    assert to == [ADDRESS] and "Bcc" not in msg and "evil" not in str(msg["To"])
    assert msg["Subject"].startswith("GPU hub: Your server train Bcc: evil@example.com will be stopped in ")
    assert "min: it has been idle" in msg["Subject"]
    text = msg.get_body(("plain",)).get_content()
    link = re.search(r"https://hub\.example\.org/services/gpu-pool/notifications/keep\?\S+", text).group(0)
    q = {k: v[0] for k, v in parse_qs(urlsplit(link).query).items()}
    assert q["user"] == "bob" and q["server"] == hostile
    key = directory.secret(pool)
    assert signing.keep_valid(key, "bob", hostile, int(q["expires"]), q["token"])
    assert abs(int(q["expires"]) - (time.time() + 50)) < 30  # valid until the deadline it warns of
    [event] = [r for r in rows(pool) if r["state"] == "sent"]
    assert event["event"] == "cull-warning" and event["payload"]["server_name"] == hostile
    pool.close()


def test_a_server_at_its_maximum_age_is_warned_without_a_keep_link(tmp_path, smtp_server):
    pool = make_pool(tmp_path)
    mail_always(pool, event="cull-warning")
    now = datetime.now(UTC)
    rules = CullRules(0, 900, profile_max_age={"tf-gpu-1": 3600})
    hub = ActiveHub([gpu_server(0, last_activity=now, started=now - timedelta(seconds=3400))])

    async def main():
        assert await CullWatch(pool, hub, rules, Notifications()).run_once() == 1
        assert await sender(pool, smtp_server.port, hub=hub).run_once() == 1

    asyncio.run(main())
    [(_, msg)] = smtp_server.inbox.messages
    assert "it reaches its maximum age" in msg["Subject"]
    assert "notifications/keep" not in msg.get_body(("plain",)).get_content()
    pool.close()


class KeepHub(ActiveHub):
    def __init__(self, servers):
        super().__init__(servers)
        self.activity: list[tuple[str, str, datetime]] = []

    async def record_activity(self, user, server, when):
        self.activity.append((user, server, when))


@pytest.fixture
def keep_service(tmp_path):
    from spawner.poolpage.handlers import notifications
    from tests.fixtures.pool_app import serving_app

    notifications._recent_keeps.clear()  # each test's users start with no keeps this minute

    pool = make_pool(tmp_path)
    now = datetime.now(UTC)
    hub = KeepHub([gpu_server(850, "train", last_activity=now - timedelta(seconds=850), started=now),
                   gpu_server(850, "old", last_activity=now - timedelta(seconds=850), profile="short",
                              started=now - timedelta(hours=3)),
                   gpu_server(850, "", user="eve", last_activity=now - timedelta(seconds=850), started=now)])
    rules = CullRules(0, 900, profile_max_age={"short": 7200})
    page = PoolPageSettings(cull_rules=rules.to_json(), cull_timeout_gpu=900)
    with serving_app(pool, lambda self: None, hub_api=hub, page=page) as url:
        yield url, pool, hub
    pool.close()


def keep_link(url: str, pool, user: str, server: str, expires: float) -> str:
    key = directory.secret(pool)
    return signing.keep_url(key, url.split("/services/")[0], "/services/gpu-pool/", user, server, int(expires))


def test_the_keep_link_counts_as_activity_for_its_owners_server_only(keep_service):
    url, pool, hub = keep_service
    link = keep_link(url, pool, "bob", "train", time.time() + 60)
    page = requests.get(link, timeout=10)
    assert page.status_code == 200 and "Keep it running" in page.text
    assert hub.activity == []  # a GET (a link scanner) keeps nothing
    done = requests.post(link, timeout=10)
    assert done.status_code == 200 and "Kept" in done.text and "culled at" in done.text, done.text
    [(user, server, when)] = hub.activity
    assert (user, server) == ("bob", "train") and abs((datetime.now(UTC) - when).total_seconds()) < 10
    # bob's link altered to name eve's server (or another of bob's): refused, nothing kept.
    for forged in (link.replace("user=bob", "user=eve").replace("server=train", "server="),
                   link.replace("server=train", "server=old")):
        r = requests.post(forged, timeout=10)
        assert r.status_code == 403 and "another user" in r.text, r.text
    assert len(hub.activity) == 1
    # Bounded: a link (or a script replaying it) keeps at most a few times a minute.
    codes = [requests.post(link, timeout=10).status_code for _ in range(6)]
    assert codes[:5] == [200] * 5 and codes[5] == 429, codes
    assert len(hub.activity) == 6


def test_an_expired_or_too_old_or_gone_servers_keep_link_says_why(keep_service):
    url, pool, hub = keep_service
    expired = keep_link(url, pool, "bob", "train", time.time() - 5)
    r = requests.post(expired, timeout=10)
    assert r.status_code == 410 and "expired at" in r.text
    r = requests.post(keep_link(url, pool, "bob", "old", time.time() + 60), timeout=10)
    assert r.status_code == 409 and "maximum age" in r.text and "cannot be kept" in r.text
    r = requests.post(keep_link(url, pool, "bob", "gone", time.time() + 60), timeout=10)
    assert r.status_code == 409 and "is not running" in r.text
    r = requests.post(url + "notifications/keep?" + urlencode({"user": "bob", "server": "train"}), timeout=10)
    assert r.status_code == 400 and "not a whole keep-it link" in r.text
    assert hub.activity == []


# --- webhooks ------------------------------------------------------------------------------------


ALLOW = WebhookNotifications(allowed_urls=["https://hooks.example.org/services/", "chat.example.org"])


@pytest.mark.parametrize("url", ["https://hooks.example.org/services/T1/B2/xyz", "https://chat.example.org/hooks/abc",
                                 "https://HOOKS.example.org:443/services/x"])
def test_urls_on_the_allow_list_pass(url):
    assert checked_url(url, ALLOW) == url


@pytest.mark.parametrize("url, says", [
    ("https://hooks.example.org.evil.test/services/x", "not on this hub's webhook allow-list"),
    ("https://hooks.example.org@evil.test/services/x", "user name or password"),
    ("https://hooks.example.org/servicesX/x", "not on this hub's webhook allow-list"),
    ("https://hooks.example.org:8443/services/x", "not on this hub's webhook allow-list"),
    ("http://chat.example.org/hooks/abc", "not on this hub's webhook allow-list"),  # a host entry: https only
    ("http://127.0.0.1:8081/hub/api/users", "not on this hub's webhook allow-list"),
    ("https://hooks.example.org/services/x\r\nX-Evil: 1", "control characters"),
    ("ftp://hooks.example.org/services/x", "https://"),
    ("https://hooks.example.org/services/" + "x" * 2000, "over 2000 characters"),
])
def test_urls_off_the_allow_list_are_refused_saying_why(url, says):
    with pytest.raises(BadWebhook) as e:
        checked_url(url, ALLOW)
    assert says in str(e.value)
    with pytest.raises(BadWebhook, match="Webhooks are off"):
        checked_url("https://hooks.example.org/services/x", WebhookNotifications())


@pytest.fixture
def webhook_service(tmp_path):
    from tests.fixtures.pool_app import serving_app

    def current_user(self):
        name = self.request.headers.get("X-User")
        return {"name": name, "scopes": [], "kind": "user", "groups": []} if name else None

    pool = make_pool(tmp_path)
    with WebhookReceiver(SECRET) as receiver:
        secret = tmp_path / "webhook-secret"
        secret.write_text(SECRET.decode() + "\n")
        hooks = WebhookNotifications(allowed_urls=[receiver.url + "/hooks/"], secret_file=str(secret),
                                     retry_delay=0.05, poll_interval=0.05, timeout=5)
        with serving_app(pool, current_user, webhooks=hooks) as url:
            yield url, pool, receiver, hooks
    pool.close()


def test_a_webhook_off_the_allow_list_is_refused_with_400_and_changes_nothing(webhook_service):
    url, pool, receiver, _ = webhook_service
    api = url + "api/notifications"
    for bad in ("http://127.0.0.1:8081/hub/api/users", receiver.url + "/elsewhere", receiver.url + "/hooks/x\r\n"):
        r = requests.put(api, json={"events": {}, "webhook": bad}, headers={"X-User": "bob"}, timeout=10)
        assert r.status_code == 400, r.text
        assert "allow-list" in r.json()["message"] or "control characters" in r.json()["message"]
    assert requests.get(api, headers={"X-User": "bob"}, timeout=10).json()["webhook"] is None
    good = receiver.url + "/hooks/bob"
    r = requests.put(api, json={"events": {}, "webhook": good}, headers={"X-User": "bob"}, timeout=10)
    assert r.status_code == 200 and r.json()["webhook"] == good
    assert r.json()["channels"]["webhook"] == {"enabled": True, "allowed": [receiver.url + "/hooks/"]}
    # A PUT of the choices alone keeps the webhook; null removes it.
    r = requests.put(api, json={"events": {"granted": {"email": "never"}}}, headers={"X-User": "bob"}, timeout=10)
    assert r.json()["webhook"] == good and r.json()["events"]["granted"]["email"] == "never"
    r = requests.put(api, json={"events": {}, "webhook": None}, headers={"X-User": "bob"}, timeout=10)
    assert r.json()["webhook"] is None


def test_a_webhook_delivery_is_signed_retried_after_a_500_and_arrives_once(webhook_service):
    url, pool, receiver, hooks = webhook_service
    requests.put(url + "api/notifications", headers={"X-User": "bob"}, timeout=10,
                 json={"events": {"granted": {"webhook": "always"}}, "webhook": receiver.url + "/hooks/bob"})
    receiver.fail_first = 1
    hub = ReadyHub(pool)

    async def main():
        await queued_grant(pool)
        s = WebhookSender(pool, hooks, "/services/gpu-pool/", "http://127.0.0.1:8000/", hub=hub,
                          public_url="https://hub.example.org")
        assert await s.run_once() == 0  # the receiver answered 500: tried again after retry_delay
        await async_until(s.run_once, what="the webhook delivered on its second try")
        for _ in range(3):
            assert await s.run_once() == 0  # once
        await s.stop()

    asyncio.run(main())
    [d] = receiver.deliveries
    assert d.signed and d.path == "/hooks/bob" and d.headers["Content-Type"] == "application/json"
    assert d.body["text"].startswith("*Your GPU is ready: your server train is running*")
    assert "https://hub.example.org/user/bob/train/" in d.body["text"]
    [hook] = [r for r in rows(pool) if r["channel"] == "webhook"]
    assert hook["state"] == "sent" and hook["attempts"] == 2
    # Without a webhook set, events get no webhook row at all.
    assert {r["channel"] for r in rows(pool, "alice")} <= {"email"}


def test_a_removed_allow_list_entry_stops_deliveries_and_a_wrong_secret_is_not_signed(webhook_service, tmp_path):
    url, pool, receiver, hooks = webhook_service
    requests.put(url + "api/notifications", headers={"X-User": "bob"}, timeout=10,
                 json={"events": {"granted": {"webhook": "always"}}, "webhook": receiver.url + "/hooks/bob"})
    narrowed = WebhookNotifications(allowed_urls=["https://chat.example.org"], secret_file=hooks.secret_file)

    async def main():
        await queued_grant(pool)
        s = WebhookSender(pool, narrowed, "/services/gpu-pool/", "http://127.0.0.1:8000/", hub=ReadyHub(pool))
        assert await s.run_once() == 0
        await s.stop()

    asyncio.run(main())
    [hook] = [r for r in rows(pool) if r["channel"] == "webhook"]
    assert hook["state"] == "skipped" and "allow-list" in hook["error"]
    assert receiver.deliveries == []
