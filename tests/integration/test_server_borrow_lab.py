"""A server on borrowed GPUs as its user sees it in JupyterLab (issue 38), in Chromium: the GPU
panel says the server runs on borrowed GPUs and with how much notice; when a request within its
share asks them back, the panel says when the server is stopped and a JupyterLab warning pops
up, before the stop.  The scenario is test_server_borrow.py's (three simulated GPUs, alice's
share 1, bob's 2), with a notice long enough for the page to be looked at."""

from __future__ import annotations

from spawner.pool.leasing.reclaim import borrowed_notice

from ..fixtures.hub import DUMMY_PASSWORD
from .test_browser import by_css, click, log_in, text_of
from .test_lab_extension_browser import open_lab
from .test_poolpage import wait_for_page
from .test_server_borrow import BORROWING, GRACE

NOTICE_S = 120  # the reclaim grace here: the panel's notice must be seen before the stop


def borrowed_lines(browser) -> list[tuple[str, str]]:
    """The panel's borrowed-GPU lines: (class, text)."""
    return [(p.get_attribute("class") or "", p.text)
            for p in browser.driver.find_elements(*by_css("#gpuhub-panel .gpuhub-borrowed"))]


def test_the_lab_panel_says_the_gpus_are_borrowed_and_when_the_server_is_stopped(make_hub, browser):
    config = BORROWING.replace(f"c.GPUPool.reclaim_grace = {GRACE}", f"c.GPUPool.reclaim_grace = {NOTICE_S}")
    assert config != BORROWING
    hub = make_hub(config, env={"GPUHUB_SIMULATED_GPUS": "3", "GPUHUB_LEASE_WAIT_TIMEOUT": "300"})
    for user in ("alice", "bob"):
        hub.create_user(user)
    assert hub.api("POST", "/groups/ml", json={"users": ["bob"]}).status_code == 201
    wait_for_page(hub, hub.user_token("alice"))
    hub.start_server("alice", {"profile": "lab-borrow-2"})  # 2 GPUs, her share is 1: borrowed

    alice = browser("alice")
    log_in(alice, hub, "alice", DUMMY_PASSWORD)
    open_lab(alice, hub, "alice")
    click(alice, "#gpuhub-status")
    notice = borrowed_notice(NOTICE_S)
    alice.wait(lambda d: (alice_lines := borrowed_lines(alice)) and alice_lines[0][1] == notice, 90,
               f"the panel never said {notice!r}: {borrowed_lines(alice)}")
    assert "gpuhub-reclaimed" not in borrowed_lines(alice)[0][0]
    alice.shot("1-borrowed")

    # bob, within his share, asks for 2 GPUs: alice's borrowed lease is asked back.
    r = hub.api("POST", "/users/bob/server", json={"profile": "tf-gpu-2"}, timeout=60)
    assert r.status_code in (201, 202), r.text
    alice.wait(lambda d: any("gpuhub-reclaimed" in cls and "this server is stopped at" in text
                             for cls, text in borrowed_lines(alice)), 60,
               f"the panel never said when the server is stopped: {borrowed_lines(alice)}")
    alice.wait(lambda d: "this server is stopped at" in text_of(alice, ".Toastify"), 30,
               f"no JupyterLab warning of the stop: {text_of(alice, '.Toastify')!r}")
    alice.shot("2-asked-back")
    assert hub.server_model("alice")["ready"]  # told before: the server still runs within its notice
