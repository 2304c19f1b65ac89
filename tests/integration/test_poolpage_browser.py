"""The GPU pool page in real Chromium: a user looks, an admin drains a GPU and runs a script.

A user logs in through the hub's login form, opens the page from the hub's
Services menu (an admin from the "GPU pool" link in the hub's bar) and sees the GPUs, their
own lease and the charts, with no admin buttons.  An admin drains a free GPU from the page (through its confirmation
page) and sees the spawn form's free count drop, then runs an action script in
the user's server from the page (a multi-line script, typed into the page's textarea).  Screenshots of each step go to
test-artifacts/test_pool_page_in_chromium.../.
"""

from __future__ import annotations

import re

from ..fixtures.hub import DUMMY_PASSWORD
from .test_browser import by_css, click, log_in, text_of
from .test_poolpage import ADMIN_ENV, wait_for_page


def free_count(browser, hub) -> str:
    """What the spawn form says of the 1-GPU profile: 'N of M free now'."""
    browser.driver.get(f"{hub.url}/hub/spawn")
    browser.wait(lambda d: "free now" in d.page_source, 60, "no free count on the spawn form")
    return re.search(r"\d+ of \d+ free now", browser.driver.page_source).group(0)


def open_pool_page(browser, hub, through_menu: bool = True) -> None:
    """From the hub's home page, through the Services menu or the "GPU pool" link beside it."""
    driver = browser.driver
    driver.get(f"{hub.url}/hub/home")
    if through_menu:
        click(browser, "li.nav-item.dropdown > a.dropdown-toggle", 30, "no Services menu")
        click(browser, "a.dropdown-item[href$='/services/gpu-pool/']", 30, "gpu-pool is not in the Services menu")
    else:
        click(browser, "#gpu-pool-link", 30, "no GPU pool link on the hub's home page")
    browser.wait(lambda d: d.find_elements(*by_css("#gpus")), 60, "the pool page did not open")


def test_pool_page_in_chromium(make_hub, browser):
    hub = make_hub(env=ADMIN_ENV)
    hub.create_user("pat")
    hub.create_user("ada")
    wait_for_page(hub, hub.user_token("pat"))
    hub.start_server("pat", {"profile": "tf-gpu-1"})

    # the user: the pool, their own lease, the charts; no admin buttons
    user = browser("pat")
    log_in(user, hub, "pat", DUMMY_PASSWORD)
    open_pool_page(user, hub)
    assert "3 free, 1 lent, 0 drained" in text_of(user, "#summary")
    assert "you" in text_of(user, "#gpus") and "for server" in text_of(user, "#active")
    assert user.driver.find_elements(*by_css("svg#chart-occupancy polygon[data-layer='lent']"))
    assert user.driver.find_elements(*by_css("svg#chart-users rect[data-name='pat']"))
    assert not user.driver.find_elements(*by_css("a.drain, #exec-form"))
    user.shot("1-user-page")
    # (Bootstrap scrolls smoothly: jump, or the shot catches it half way)
    user.driver.execute_script("window.scrollTo({top: document.getElementById('usage').offsetTop, "
                               "behavior: 'instant'})")
    user.shot("1-user-charts")

    # the admin drains a free GPU from the page, confirming first
    admin = browser("ada")
    log_in(admin, hub, "ada", DUMMY_PASSWORD)
    assert free_count(admin, hub) == "3 of 4 free now"
    admin.shot("2-spawn-form-before")
    open_pool_page(admin, hub, through_menu=False)
    admin.shot("3-admin-page")
    row = next(r for r in admin.driver.find_elements(*by_css("#gpus tbody tr")) if "free" in r.text)
    uuid = row.get_attribute("data-uuid")
    row.find_element(*by_css("a.drain")).click()
    admin.wait(lambda d: d.find_elements(*by_css("#confirm")), 30, "no confirmation page")
    assert "Drain GPU" in text_of(admin, "#what") and uuid in text_of(admin, "#what")
    admin.shot("4-confirm-drain")
    assert not any(g.drained for g in hub.ledger().gpus())
    click(admin, "#confirm")
    admin.wait(lambda d: d.find_elements(*by_css("#done")), 30, "no message after the drain")
    assert "drained" in text_of(admin, "#done") and "2 free, 1 lent, 1 drained" in text_of(admin, "#summary")
    admin.shot("5-drained")
    assert free_count(admin, hub) == "2 of 3 free now"
    admin.shot("6-spawn-form-after")

    # ...and runs a multi-line script in pat's server from the page (the textarea sends CRLF)
    admin.driver.get(f"{hub.url}/services/gpu-pool/")
    admin.driver.find_element(*by_css("#exec-form textarea[name='script']")).send_keys(
        'cd /tmp\npwd\nif [ "$(id -u)" != 0 ]; then\n  echo "hello from $(id -u)"\nfi\n')
    admin.driver.find_element(*by_css("#exec-form input[name='users']")).send_keys("pat")
    click(admin, "#exec-form button[type='submit']")
    admin.wait(lambda d: d.find_elements(*by_css("#targets")), 30, "no confirmation of the script")
    assert text_of(admin, "#targets").startswith("pat")
    admin.shot("7-confirm-script")
    # The confirmation asks for the admin's password again (issue 42, item 6).
    admin.driver.find_element(*by_css("#confirm-form input[name='password']")).send_keys(DUMMY_PASSWORD)
    click(admin, "#confirm")
    admin.wait(lambda d: d.find_elements(*by_css("#results")), 90, "no script results")
    results = text_of(admin, "#results")
    assert "pat" in results and "hello from" in results and "hello from 0" not in results
    assert "/tmp" in results and "can't cd" not in results and "syntax error" not in results, results
    assert admin.driver.find_elements(*by_css("#results tr.ok")), results
    admin.shot("8-script-results")
