"""Browser notifications from JupyterLab, in real Chromium (issue 39): pat works in JupyterLab on a
CPU server, in two tabs, with notifications allowed; queued for a GPU server behind a full pool,
pat is shown "Your GPU is ready" by the browser (and as a JupyterLab toast) once the hub says that
server is ready.  One poller per browser, not one per tab: only the tab holding the Web Lock asks
the feed (through its server, GET gpuhub/notifications), a pool page opened beside them (same
lock) does not ask either, and when the asking tab closes another one takes over.

Chromium's permission is granted through CDP (`Browser.grantPermissions`); each notification the
page makes is recorded by a wrapper put before any of its scripts (test_notify_browser.py)."""

from __future__ import annotations

import time

from ..fixtures.hub import DUMMY_PASSWORD, wait_for
from .test_browser import LAB_TIMEOUT, by_css, log_in, text_of
from .test_notifications import ReadyWatch
from .test_notify_browser import RECORD_NOTIFICATIONS, shown
from .test_poolpage import wait_for_page

ASKS = ("return performance.getEntriesByType('resource')"
        ".filter(e => e.name.includes('gpuhub/notifications')).length")


def open_lab(browser, hub, user: str) -> None:
    browser.driver.get(f"{hub.url}/user/{user}/lab")
    browser.wait(lambda d: d.find_elements(*by_css("#jp-main-statusbar #gpuhub-status")), LAB_TIMEOUT,
                 "JupyterLab's status bar has no GPU status item (is gpuhub-lab installed?)")


POOL_ASKS = ("return performance.getEntriesByType('resource')"
             ".filter(e => e.name.includes('notifications/feed')).length")


def asks(driver) -> int:
    return driver.execute_script(ASKS)


class NamedReadyWatch(ReadyWatch):
    """When the hub's model of pat's server `gpu` first says ready (polled every 0.1 s)."""

    def _run(self):
        while not self._stop.is_set() and self.at is None:
            server = self.hub.server_model(self.user, "gpu")
            if server and server.get("ready"):
                self.at = time.time()
            self._stop.wait(0.1)


def test_jupyterlab_shows_the_ready_notification_from_one_tab_per_browser(make_hub, browser, capsys):
    hub = make_hub("c.JupyterHub.allow_named_servers = True\n", env={"GPUHUB_JOBS": "false"})
    for user in ("eve", "fay", "pat"):
        hub.create_user(user)
    wait_for_page(hub, hub.user_token("pat"))
    hub.start_server("fay", {"profile": "tf-gpu-2"})
    hub.start_server("eve", {"profile": "tf-gpu-2"})  # the pool (4 GPUs) is full
    hub.start_server("pat", {"profile": "tf-cpu"})

    pat = browser("pat")
    driver = pat.driver
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": RECORD_NOTIFICATIONS})
    # JupyterLab loads hundreds of files: room for every request in the timing buffer (250 by default).
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument",
                           {"source": "performance.setResourceTimingBufferSize(100000);"})
    log_in(pat, hub, "pat", DUMMY_PASSWORD)
    driver.execute_cdp_cmd("Browser.grantPermissions", {"origin": hub.url, "permissions": ["notifications"]})
    open_lab(pat, hub, "pat")
    first = driver.current_window_handle
    driver.switch_to.new_window("tab")
    open_lab(pat, hub, "pat")
    second = driver.current_window_handle

    def per_tab() -> dict[str, int]:
        counts = {}
        for handle in (first, second):
            driver.switch_to.window(handle)
            counts[handle] = asks(driver)
        return counts

    # One tab asks (every poll_after_s, 5 s), the other waits for the lock.
    pat.wait(lambda d: sum(per_tab().values()) >= 2, 60, "no JupyterLab tab asks for notifications")
    counts = per_tab()
    leader = first if counts[first] else second
    other = second if leader == first else first
    assert counts[other] == 0, f"both tabs ask the feed: {counts}"

    # A pool page opened beside them takes the same lock: it shows "on" but does not ask either.
    driver.switch_to.new_window("tab")
    pool_tab = driver.current_window_handle
    driver.get(f"{hub.url}/services/gpu-pool/")
    pat.wait(lambda d: "Notifications on" in text_of(pat, "#notify-state"), 60,
             "the pool page did not turn its browser notifications on")
    driver.switch_to.window(leader)
    seen = asks(driver)
    pat.wait(lambda d: asks(d) >= seen + 2, 60, "the leading JupyterLab tab stopped asking")
    driver.switch_to.window(pool_tab)
    assert driver.execute_script(POOL_ASKS) == 0, "the pool page asks beside the leading JupyterLab tab"
    assert per_tab()[other] == 0

    r = hub.api("POST", "/users/pat/servers/gpu", json={"profile": "tf-gpu-1"})
    assert r.status_code == 202, r.text  # queued
    wait_for(lambda: hub.ledger().queue(), timeout=30, what="pat in the queue", hub=hub)

    def told_anywhere() -> list[dict]:
        out = []
        for handle in (first, second, pool_tab):
            driver.switch_to.window(handle)
            out += shown(pat)
        return out

    with NamedReadyWatch(hub, "pat") as ready:
        hub.stop_server("eve")  # the grant
        told = pat.wait(lambda d: told_anywhere(), 120, "no notification after the grant")
        wait_for(lambda: ready.at is not None, timeout=10, what="the hub's model saying ready", hub=hub)
    assert (hub.server_model("pat", "gpu") or {}).get("ready"), "told before the hub said ready"
    assert [t["title"] for t in told] == ["Your GPU is ready: your server gpu is running"], told
    driver.switch_to.window(leader)
    assert len(shown(pat)) == 1  # shown by the tab that asks
    pat.wait(lambda d: "Your GPU is ready" in text_of(pat, ".Toastify"), 30, "no JupyterLab toast")
    pat.shot("1-ready-toast")
    with capsys.disabled():
        print(f"\nready (the hub's model, polled every 0.1 s) -> JupyterLab's browser notification: "
              f"{told[0]['at'] / 1000 - ready.at:.2f} s (the leading tab asks every 5 s)")

    # The leader's tab closes: one of the others takes the lock and asks from now on.
    driver.close()

    def someone_asks() -> bool:
        driver.switch_to.window(other)
        lab = asks(driver)
        driver.switch_to.window(pool_tab)
        return lab + driver.execute_script(POOL_ASKS) >= 1
    pat.wait(lambda d: someone_asks(), 60, "no remaining tab took over the asking")
    for handle in (other, pool_tab):
        driver.switch_to.window(handle)
        assert len(shown(pat)) == 0  # nothing told twice
