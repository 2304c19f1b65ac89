"""The gpu-pool service against a real hub (which starts it), the real ledger and Docker."""

from __future__ import annotations

import requests

from ..fixtures.hub import DUMMY_PASSWORD, Hub, wait_for

# ada administers the pool and may run action scripts (a scope of its own, granted to no one by default).
ADMIN_ENV = {"GPUHUB_ADMIN_USERS": "ada", "GPUHUB_POOL_EXEC_USERS": "ada"}


# Longer than the service's own longest answer: a job's cancel answers once its units are
# stopped, waiting up to 60 s (JobRunner.cancel).  At 30 s a fresh run under load gave up on a
# cancel whose job had taken 12 s to start and then its stop grace: the test failed, not the
# service.
PAGE_API_TIMEOUT = 90


def page_api(hub: Hub, method: str, path: str, token: str, **kwargs) -> requests.Response:
    return requests.request(method, f"{hub.url}/services/gpu-pool/{path}",
                            headers={"Authorization": f"token {token}"}, timeout=PAGE_API_TIMEOUT, **kwargs)


def wait_for_page(hub: Hub, token: str) -> None:
    def answers():
        try:
            return page_api(hub, "GET", "api/gpus", token).status_code == 200
        except requests.RequestException:
            return False
    wait_for(answers, timeout=60, what="the gpu-pool service", hub=hub)


def logged_in(hub: Hub, name: str) -> requests.Session:
    session = requests.Session()
    session.get(f"{hub.url}/hub/login", timeout=30)
    r = session.post(f"{hub.url}/hub/login", timeout=30, data={
        "username": name, "password": DUMMY_PASSWORD, "_xsrf": session.cookies.get("_xsrf")})
    assert r.status_code == 200
    return session


def test_users_see_the_pool_and_only_admins_drain(make_hub):
    hub = make_hub(env=ADMIN_ENV)
    for name in ("pat", "bob", "quinn"):
        hub.create_user(name)
    hub.create_user("ada", admin=True)
    pat, ada = hub.user_token("pat"), hub.user_token("ada")
    wait_for_page(hub, pat)
    hub.start_server("pat", {"profile": "tf-gpu-1"})
    hub.start_server("bob", {"profile": "tf-gpu-1"})

    # a plain user: every GPU, their own lease by name, nobody else's
    r = page_api(hub, "GET", "api/gpus", pat)
    gpus = r.json()["gpus"]
    assert len(gpus) == 4 and sorted(g["state"] for g in gpus) == ["free", "free", "lent", "lent"]
    assert sorted(str(g["holder"]) for g in gpus if g["state"] == "lent") == ["None", "pat"]
    assert "bob" not in r.text
    page = page_api(hub, "GET", "", pat)
    assert page.status_code == 200 and 'id="gpus"' in page.text and 'id="active"' in page.text
    assert "bob" not in page.text and "another user" in page.text
    usage = page_api(hub, "GET", "api/usage", pat).json()
    assert list(usage["users"]) == ["pat"] and usage["groups"] == {}
    assert page_api(hub, "GET", "api/queue", pat).json() == {"queue": []}

    # ...who cannot drain
    free = next(g["uuid"] for g in gpus if g["state"] == "free")
    r = page_api(hub, "POST", f"api/gpus/{free}/drain", pat)
    assert r.status_code == 403 and "custom:gpu-pool:admin" in r.json()["message"]
    assert page_api(hub, "GET", "api/audit", pat).status_code == 403

    # an admin drains it: the spawn form counts one GPU fewer (drained ones are not
    # counted at all), the audit says who
    quinn = logged_in(hub, "quinn")
    assert "2 of 4 free now" in quinn.get(f"{hub.url}/hub/spawn", timeout=30).text
    r = page_api(hub, "POST", f"api/gpus/{free}/drain", ada)
    assert r.status_code == 200, r.text
    assert r.json()["gpu"]["state"] == "drained"
    assert "1 of 3 free now" in quinn.get(f"{hub.url}/hub/spawn", timeout=30).text
    audit = page_api(hub, "GET", "api/audit", ada).json()["audit"]
    assert (audit[0]["actor"], audit[0]["action"], audit[0]["uuid"]) == ("ada", "drain", free)
    admin_view = page_api(hub, "GET", "api/gpus", ada).json()["gpus"]
    assert sorted(str(g["holder"]) for g in admin_view if g["state"] == "lent") == ["bob", "pat"]
    assert set(page_api(hub, "GET", "api/usage", ada).json()["users"]) == {"pat", "bob"}
    csv = page_api(hub, "GET", "api/usage.csv", ada)
    assert csv.headers["Content-Type"].startswith("text/csv") and "user,bob," in csv.text
    assert page_api(hub, "POST", f"api/gpus/{free}/undrain", ada).json()["gpu"]["state"] == "free"

    # bad input: 4xx with a JSON message, never a traceback
    for method, path, status in [("POST", "api/gpus/GPU-nope/drain", 404),
                                 ("GET", "api/usage?since=yesterday", 400),
                                 ("GET", "api/usage?since=2026-02-01&until=2026-01-01", 400)]:
        r = page_api(hub, method, path, ada)
        assert r.status_code == status, (path, r.text)
        assert r.json()["message"] and "Traceback" not in r.text
    assert page_api(hub, "GET", "api/gpus", "not-a-token").status_code == 403


def test_a_logged_in_browser_gets_the_page_through_the_hubs_oauth(make_hub):
    hub = make_hub()
    hub.create_user("pat")
    wait_for_page(hub, hub.user_token("pat"))
    session = logged_in(hub, "pat")
    r = session.get(f"{hub.url}/services/gpu-pool/", timeout=30)
    assert r.status_code == 200, r.text[:500]
    assert 'id="gpus"' in r.text and "pat" in r.text and "4 free" in r.text
    assert any("oauth2/authorize" in h.url for h in r.history)
    # the service is in the hub's Services menu
    assert "/services/gpu-pool/" in session.get(f"{hub.url}/hub/home", timeout=30).text
    # ...and stops at the hub's first signal (no escalation to SIGTERM)
    hub.stop()
    log = hub.log_path.read_text(errors="replace")
    assert "GPU pool page stopped" in log and "Terminating" not in log, log[-3000:]
