"""The notification choices page and a user-set address, in real Chromium through the hub's login
(OAuth into the gpu-pool service) with a real SMTP server on loopback (issue 39).

ana opens the pool page, follows its "Notification choices" button, sets "ready" to always by e-mail and
saves: the service's API (with ana's token) says so.  The page's requests carry the hub's XSRF
token: the same PUT from the page without it is refused (403) and changes nothing.  Then ana sets
her own address on the page: a confirmation mail reaches the SMTP server at that address; mail
still goes to the directory's address until ana opens the link and presses its button; a
changed (forged) link is refused and confirms nothing."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import requests

from spawner.notify import directory

from ..fixtures.hub import DUMMY_PASSWORD, wait_for
from ..fixtures.smtp import SMTPServer
from .test_browser import by_css, click, log_in, text_of
from .test_notifications import config
from .test_poolpage import wait_for_page

DIRECTORY = "ana@example.org"
OWN = "ana.home@example.net"

PUT_WITHOUT_XSRF = """
const done = arguments[arguments.length - 1];
fetch(arguments[0], {method: "PUT", credentials: "same-origin", headers: {"Content-Type": "application/json"},
                     body: JSON.stringify({events: {"budget": {"email": "never"}}})})
  .then(r => done(r.status)).catch(e => done(String(e)));
"""


def test_choices_page_sets_choices_with_xsrf_and_confirms_an_own_address(make_hub, browser):
    with SMTPServer() as smtp:
        hub = make_hub(config(smtp.port))
        hub.create_user("ana")
        token = hub.user_token("ana")
        wait_for_page(hub, token)
        api = f"{hub.url}/services/gpu-pool/api/notifications"
        auth = {"Authorization": f"token {token}"}
        directory.record_address(hub.ledger(), "ana", {"user_attributes": {"mail": [DIRECTORY]}})

        ana = browser("ana")
        driver = ana.driver
        log_in(ana, hub, "ana", DUMMY_PASSWORD)
        driver.get(f"{hub.url}/services/gpu-pool/")
        click(ana, "#notify-choices", 60, "the pool page has no Notifications button")
        ana.wait(lambda d: d.find_elements(*by_css('select[name="granted.email"]')), 60, "no choices page")
        ana.wait(lambda d: "from the directory" in text_of(ana, "#address-now"), 30,
                 "the page did not load the choices")
        assert DIRECTORY in text_of(ana, "#address-now")
        driver.execute_script("document.querySelector('select[name=\"granted.email\"]').value = 'always'")
        click(ana, "#save")
        ana.wait(lambda d: text_of(ana, "#choices-state") == "Saved.", 30,
                 f"not saved: {text_of(ana, '#choices-state')!r}")
        ana.shot("1-choices-saved")
        doc = requests.get(api, headers=auth, timeout=10).json()
        assert doc["events"]["granted"]["email"] == "always"

        # The page's own cookie, without the XSRF token: refused, nothing changed.
        status = driver.execute_async_script(PUT_WITHOUT_XSRF, api)
        assert status == 403, status
        assert requests.get(api, headers=auth, timeout=10).json()["events"]["budget"]["email"] == "auto"

        # An own address: confirmation mail first, mail there only after the link.
        driver.find_element(*by_css("#address")).send_keys(OWN)
        click(ana, "#address-set")
        ana.wait(lambda d: "confirmation link went to" in text_of(ana, "#address-state"), 60,
                 f"no confirmation mail asked: {text_of(ana, '#address-state')!r}")
        wait_for(lambda: smtp.inbox.messages, timeout=30, what="the confirmation mail", hub=hub)
        [(to, msg)] = smtp.inbox.messages
        assert to == [OWN] and "confirm your address" in msg["Subject"]
        assert requests.get(api, headers=auth, timeout=10).json()["address"] == DIRECTORY
        link = re.search(r"(https?://\S+/notifications/confirm\?\S+)", msg.get_body(("plain",)).get_content()).group(1)
        parts = urlsplit(link)
        link = f"{hub.url}{parts.path}?{parts.query}"  # the mail's public_url is the deployment's name

        forged = link.replace("ana.home%40example.net", "mallory%40example.net")
        assert forged != link
        driver.get(forged)
        ana.wait(lambda d: "signature does not match" in d.page_source, 30, "a forged link was not refused")
        driver.get(link)
        click(ana, "button[type=submit]", 30, "the link's page has no button")
        ana.wait(lambda d: "Confirmed" in d.page_source, 30, "the link did not confirm")
        ana.shot("2-confirmed")
        doc = requests.get(api, headers=auth, timeout=10).json()
        assert doc["address"] == OWN and doc["own_address"]["confirmed"] == OWN
