"""A user-set e-mail address confirmed by a link (issue 39), against a real SMTP server on loopback
(aiosmtpd) and the pool service's app on a real port: the confirmation mail goes to the new address,
mail goes there only after its link's button is pressed, a forged or expired link is refused, and
the asks are bounded.  Also the notification choices page (its table and the nav link to it)."""

from __future__ import annotations

import asyncio
import re
import time
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest

from devservices.waiting import until
from spawner.notify import directory, own_address, signing
from spawner.notify.sender import Sender
from spawner.pool.ledger.events import EVENTS
from spawner.pool.ledger.job_records import JobLedger
from spawner.pool.ledger.outbox import CHANNELS
from tests.fixtures.smtp import SMTPServer

from .test_notify import AUTH_STATE, ReadyHub, always, free_port, make_pool, settings

requests = pytest.importorskip("requests")
HOME = "bob.home@example.net"
BOB = {"X-User": "bob"}


@pytest.fixture
def smtp_server():
    with SMTPServer() as server:
        yield server


def serve(tmp_path, port: int, **mail):
    from tests.fixtures.pool_app import serving_app

    def current_user(self):
        name = self.request.headers.get("X-User")
        return {"name": name, "scopes": [], "kind": "user", "groups": []} if name else None

    pool = make_pool(tmp_path)
    directory.record_address(pool, "bob", AUTH_STATE)  # the directory's: bob@example.org
    return pool, serving_app(pool, current_user, notify=settings(port, public_url="", **mail))


def link_in(msg) -> str:
    return re.search(r"(http://\S+/notifications/confirm\?\S+)", msg.get_body(("plain",)).get_content()).group(1)


def job_ended_mail_goes_to(pool, port: int, inbox) -> list[str]:
    """A job of bob's ends; the sender mails it: to whom."""
    jobs = JobLedger(pool)
    job = jobs.create("bob", [], "p", ["true"], ".", 60, "node-1", 1, 1)
    jobs.update(job.id, ("queued",), "ended_at", state="cancelled")
    before = len(inbox.messages)
    assert asyncio.run(Sender(pool, settings(port), "/services/gpu-pool/", "", hub=ReadyHub(pool)).run_once()) == 1
    return inbox.messages[before][0] if len(inbox.messages) > before else []


def test_a_set_address_gets_mail_only_after_its_link_is_confirmed(tmp_path, smtp_server):
    pool, serving = serve(tmp_path, smtp_server.port)
    always(pool)
    with serving as url:
        api = url + "api/notifications"
        r = requests.post(api + "/address", json={"address": HOME}, headers=BOB, timeout=30)
        assert r.status_code == 202, r.text
        assert r.json()["pending"] == HOME and HOME in r.json()["message"]
        [(to, msg)] = smtp_server.inbox.messages
        assert to == [HOME] and msg["To"] == HOME and "confirm your address" in msg["Subject"]
        link = link_in(msg)
        assert urlsplit(link).path == "/services/gpu-pool/notifications/confirm"
        doc = requests.get(api, headers=BOB, timeout=10).json()
        assert doc["address"] == "bob@example.org"  # not yet
        assert doc["own_address"]["confirmed"] is None
        assert [p["address"] for p in doc["own_address"]["pending"]] == [HOME]
        assert job_ended_mail_goes_to(pool, smtp_server.port, smtp_server.inbox) == ["bob@example.org"]

        # A GET (a mail scanner) shows a button and confirms nothing.
        page = requests.get(link, timeout=10)
        assert page.status_code == 200 and "Confirm this address" in page.text
        assert requests.get(api, headers=BOB, timeout=10).json()["address"] == "bob@example.org"
        # Forged: another address, another user, no token: refused, nothing changed.
        query = parse_qs(urlsplit(link).query)
        for name, value in (("address", "mallory@evil.example"), ("user", "carol"), ("token", "x" * 32)):
            forged = url + "notifications/confirm?" + urlencode({**{k: v[0] for k, v in query.items()}, name: value})
            assert requests.post(forged, timeout=10).status_code == 403, name
            assert requests.get(forged, timeout=10).status_code == 403, name
        assert requests.get(api, headers=BOB, timeout=10).json()["address"] == "bob@example.org"

        done = requests.post(link, timeout=10)
        assert done.status_code == 200 and f"go to <b>{HOME}</b>" in done.text
        doc = requests.get(api, headers=BOB, timeout=10).json()
        assert doc["address"] == HOME and doc["own_address"] == {
            "directory": "bob@example.org", "confirmed": HOME, "pending": []}
        assert job_ended_mail_goes_to(pool, smtp_server.port, smtp_server.inbox) == [HOME]

        # Choices set later keep the address; removing it goes back to the directory's.
        assert requests.put(api, data='{"events": {"budget": {"email": "never"}}}', headers=BOB,
                            timeout=10).status_code == 200
        assert requests.get(api, headers=BOB, timeout=10).json()["address"] == HOME
        gone = requests.delete(api + "/address", headers=BOB, timeout=10)
        assert gone.status_code == 200 and gone.json()["address"] == "bob@example.org"
        assert requests.post(link, timeout=10).status_code == 409  # the old link confirms nothing now
        assert requests.get(api, headers=BOB, timeout=10).json()["address"] == "bob@example.org"
        # carol's record was never touched by any of this.
        assert requests.get(api, headers={"X-User": "carol"}, timeout=10).json()["own_address"]["confirmed"] is None
    pool.close()


def test_an_expired_link_is_refused(tmp_path, smtp_server):
    pool, serving = serve(tmp_path, smtp_server.port, confirm_max_age=1.0)
    with serving as url:
        r = requests.post(url + "api/notifications/address", json={"address": HOME}, headers=BOB, timeout=30)
        assert r.status_code == 202, r.text
        link = link_in(smtp_server.inbox.messages[0][1])
        expires = int(parse_qs(urlsplit(link).query)["expires"][0])
        until(lambda: time.time() > expires + 0.1, timeout=5, what="the link's expiry passing")
        for method in (requests.get, requests.post):
            refused = method(link, timeout=10)
            assert refused.status_code == 410 and "expired" in refused.text
        # A link signed with the real key, expiry in the past: refused too (the expiry is checked, not only signed).
        key = directory.secret(pool)
        old = signing.confirm_url(key, url.split("/services/")[0], "/services/gpu-pool/", "bob", HOME,
                                  int(time.time()) - 5)
        assert requests.post(old, timeout=10).status_code == 410
        assert requests.get(url + "api/notifications", headers=BOB, timeout=10).json()["address"] == "bob@example.org"
    pool.close()


def test_asks_are_bounded_per_hour_and_in_pending_addresses(tmp_path, smtp_server):
    pool, serving = serve(tmp_path, smtp_server.port, confirmations_per_hour=4)
    with serving as url:
        api = url + "api/notifications/address"
        codes = [requests.post(api, json={"address": f"a{i}@example.net"}, headers=BOB, timeout=30)
                 for i in range(5)]
        assert [c.status_code for c in codes] == [202, 202, 202, 202, 429]
        assert "At most 4 confirmation mails an hour" in codes[4].json()["message"]
        assert len(smtp_server.inbox.messages) == 4
        pending = requests.get(url + "api/notifications", headers=BOB, timeout=10).json()["own_address"]["pending"]
        assert [p["address"] for p in pending] == ["a1@example.net", "a2@example.net", "a3@example.net"]
        # The oldest ask's link (no longer pending) confirms nothing.
        first = link_in(smtp_server.inbox.messages[0][1])
        assert requests.post(first, timeout=10).status_code == 409
        # Another user has their own hour.
        assert requests.post(api, json={"address": "c@example.net"}, headers={"X-User": "carol"},
                             timeout=30).status_code == 202
    pool.close()


@pytest.mark.parametrize("body, says", [
    ({"address": "bob@example.org\r\nBcc: all@example.org"}, "not one plain e-mail address"),
    ({"address": "Bob <bob@example.org>"}, "not one plain e-mail address"),
    ({"address": "x" * 300 + "@example.org"}, "not one plain e-mail address"),
    ({"address": 3}, "must be an e-mail address"),
    ({"mail": "bob@example.org"}, 'The body must be {"address"'),
])
def test_bad_addresses_are_refused_and_nothing_is_sent(tmp_path, smtp_server, body, says):
    pool, serving = serve(tmp_path, smtp_server.port)
    with serving as url:
        r = requests.post(url + "api/notifications/address", json=body, headers=BOB, timeout=10)
        assert r.status_code == 400 and says in r.json()["message"], r.text
        assert smtp_server.inbox.messages == []
        assert requests.get(url + "api/notifications", headers=BOB, timeout=10).json()["own_address"]["pending"] == []
    pool.close()


def test_a_dead_mail_server_is_a_502_and_mail_off_is_a_409(tmp_path):
    pool, serving = serve(tmp_path, free_port(), timeout=1.0)
    with serving as url:
        r = requests.post(url + "api/notifications/address", json={"address": HOME}, headers=BOB, timeout=30)
        assert r.status_code == 502 and "did not take the confirmation mail" in r.json()["message"]
        assert requests.post(url + "api/notifications/address", json={"address": HOME},
                             timeout=10).status_code == 403  # not logged in
    pool.close()
    (tmp_path / "off").mkdir()
    pool, serving = serve(tmp_path / "off", free_port(), enabled=False)
    with serving as url:
        r = requests.post(url + "api/notifications/address", json={"address": HOME}, headers=BOB, timeout=10)
        assert r.status_code == 409 and "off on this hub" in r.json()["message"]
    pool.close()


def test_the_choices_page_has_every_event_and_channel_and_the_pool_page_links_it(tmp_path, smtp_server):
    pool, serving = serve(tmp_path, smtp_server.port)
    with serving as url:
        page = requests.get(url + "notifications", headers=BOB, timeout=10)
        assert page.status_code == 200
        for event in EVENTS:
            for channel in CHANNELS:
                assert f'name="{event}.{channel}"' in page.text
        assert 'id="address-form"' in page.text and '"X-XSRFToken": xsrf' in page.text
        pool_page = requests.get(url, headers=BOB, timeout=10).text
        assert 'href="/services/gpu-pool/notifications"' in pool_page
    pool.close()


def test_the_own_address_part_is_checked_and_bounded():
    raw, expires = own_address.ask(None, "a@example.org", 1000.0, 60.0, 3)
    assert own_address.part(raw)["pending"] == [{"address": "a@example.org", "expires": 1060}]
    assert own_address.effective(raw, "dir@example.org") == "dir@example.org"
    with pytest.raises(own_address.NotPending):
        own_address.confirm(raw, "a@example.org", expires + 1, 1001.0)  # another expiry: not this ask
    done = own_address.confirm(raw, "a@example.org", expires, 1001.0)
    assert own_address.effective(done, "dir@example.org") == "a@example.org"
    # A document of choices stored afterwards keeps the address; PUT cannot write it.
    kept = own_address.carried(done, '{"events": {}, "webhook": null}')
    assert own_address.effective(kept, None) == "a@example.org"
    assert own_address.part('{"own_address": "junk"}') == own_address.part(None)
