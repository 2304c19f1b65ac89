"""The notification choices page (`notifications`), and the user-set e-mail address: set it
(`POST api/notifications/address`, a confirmation mail with a signed link), remove it (`DELETE`),
and confirm it by the link (`notifications/confirm`) (notify/own_address.py).

The page is the pool page's look: a table of events x channels whose choices are read from and
written to `api/notifications` by the page's script, with the hub's XSRF token (the login's rule
for a script's requests made with a cookie), and the address form.  A confirmation mail is sent
here, off the loop on this module's own small executor and within `EmailNotifications.timeout`
per SMTP step, so a dead SMTP server delays only the person who asked (502 saying so).  A confirm
link needs no login (it is opened from a mail client): its signature names one user, one address
and the expiry; a GET shows a button, the POST confirms, and only while that address still waits.
"""

from __future__ import annotations

import asyncio
import html
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from email.utils import parseaddr

from jupyterhub.utils import url_path_join
from tornado import web

from ...notify import directory, own_address, signing, smtp
from ...notify.settings import EmailNotifications
from ...pool.ledger.events import EVENTS
from ...pool.ledger.outbox import CHANNELS
from ...pool.ledger.schema import NAME_MAX
from .actions import xsrf_of
from .base import LEDGER_TIMEOUT, APIHandler, BaseHandler, Unframed, ledger_call, log
from .notifications import PAGE

BODY_MAX = 1024  # bytes of a POST api/notifications/address body
SENDS_AT_ONCE = 2  # confirmation mails in flight at once, for the whole service
_mailer = ThreadPoolExecutor(max_workers=SENDS_AT_ONCE, thread_name_prefix="confirm-mail")

# What the page calls the events and channels (the API's names are in the page too).
EVENT_LABELS = {
    "granted": "Your GPU is ready (a queued server got its GPUs)",
    "job-ended": "A job or cluster ended",
    "cull-warning": "An idle server is about to be culled",
    "reclaimed": "Borrowed GPUs are asked back",
    "budget": "A GPU-hour budget reached 80 % or 100 %",
    "booking": "Your booking starts",
    "booked-out": "Your server holds a GPU someone booked",
}
CHANNEL_LABELS = {"email": "E-mail", "webhook": "Webhook", "browser": "Browser"}


def _mail_settings(handler) -> EmailNotifications:
    s = handler.settings.get("notify")
    return s if s is not None else EmailNotifications()


class ChoicesPage(BaseHandler):
    """GET notifications: the page (its script reads and writes api/notifications)."""

    @web.authenticated
    async def get(self):
        viewer = self.viewer()
        mail = _mail_settings(self)
        self.finish(self.settings["jinja"].get_template("notifications.html").render(
            viewer=viewer, base_url=self.settings["base_url"], prefix=self.settings["prefix"],
            xsrf=xsrf_of(self), events=[(e, EVENT_LABELS.get(e, e)) for e in EVENTS],
            channels=[(c, CHANNEL_LABELS.get(c, c)) for c in CHANNELS], mail_enabled=mail.enabled,
            confirm_hours=mail.confirm_max_age / 3600))


class AddressAPI(APIHandler):
    """POST: ask for a confirmation mail to an address of the user's; DELETE: back to the directory's."""

    def _mail(self) -> EmailNotifications:
        mail = _mail_settings(self)
        if not mail.enabled or mail.problems():
            raise web.HTTPError(409, "E-mail notifications are off on this hub (EmailNotifications.enabled): "
                                     "there is no address to set")
        return mail

    async def post(self):
        viewer = self.require_viewer()
        mail = self._mail()
        body = self.json_body(BODY_MAX)
        if not isinstance(body, dict) or set(body) != {"address"}:
            raise web.HTTPError(400, 'The body must be {"address": "name@domain"}')
        try:
            address = own_address.checked(body["address"])
        except own_address.BadAddress as exc:
            raise web.HTTPError(400, str(exc)) from None
        now = time.time()
        expires_box: list[int] = []

        def change(raw):
            new, expires = own_address.ask(raw, address, now, mail.confirm_max_age, mail.confirmations_per_hour)
            expires_box.append(expires)
            return new
        try:
            await self.call(directory.update_own_address, self.pool, viewer.name, change)
        except own_address.TooMany as exc:
            raise web.HTTPError(429, str(exc)) from None
        expires = expires_box[-1]
        key = await ledger_call(self.settings["notify_key"], timeout=LEDGER_TIMEOUT)
        public = mail.public_url or f"{self.request.protocol}://{self.request.host}"
        link = signing.confirm_url(key, public, self.settings["prefix"], viewer.name, address, expires)
        domain = parseaddr(mail.from_address)[1].rpartition("@")[2] or "gpu-hub.invalid"
        msg = own_address.compose(viewer.name, address, link, mail.from_address, expires, domain=domain)
        loop = asyncio.get_running_loop()
        outcome = await loop.run_in_executor(_mailer, smtp.send, msg, mail)
        if outcome.result != smtp.SENT:
            log.warning("The confirmation mail for %s's address was not sent: %s", viewer.name, outcome.error)
            raise web.HTTPError(502, "The mail server did not take the confirmation mail; try again in a few "
                                     "minutes (this ask counted towards the hourly limit)")
        log.info("%s asked to confirm an address of their own; the mail went out", viewer.name)
        self.write_json({"pending": address, "expires_at": datetime.fromtimestamp(expires, UTC).isoformat(),
                         "message": f"A mail with a confirmation link went to {address}: open it within "
                                    f"{mail.confirm_max_age / 3600:g} h. Until then mail goes where it went."},
                        status=202)

    async def delete(self):
        viewer = self.require_viewer()
        await self.call(directory.update_own_address, self.pool, viewer.name, own_address.clear)
        log.info("%s went back to the directory's address", viewer.name)
        raw, address = await self.call(directory.read_stored, self.pool, viewer.name)
        self.write_json(own_address.view(raw, address, time.time()))


class Confirm(Unframed, web.RequestHandler):
    """No login: the link's signature is the authority (one user, one address, until it expires)."""

    def _checked(self) -> tuple[str, str, int]:
        if len(self.request.body) > 4096 or len(self.request.query) > 4096:
            raise web.HTTPError(413, "This request is too large.")
        user, address = self.get_argument("user", ""), self.get_argument("address", "")
        try:
            expires = int(self.get_argument("expires", ""))
        except ValueError:
            expires = -1
        if not user or len(user) > NAME_MAX or not address or len(address) > NAME_MAX or expires < 0:
            raise web.HTTPError(400, "This link is not a whole confirmation link: copy it from the mail again.")
        return user, address, expires

    async def _valid(self) -> tuple[str, str, int]:
        user, address, expires = self._checked()
        key = await ledger_call(self.settings["notify_key"], timeout=LEDGER_TIMEOUT)
        if not signing.confirm_valid(key, user, address, expires, self.get_argument("token", "")):
            raise web.HTTPError(403, "This link's signature does not match: it was changed, or is not from the "
                                     "GPU hub. Nothing was confirmed.")
        if time.time() > expires:
            raise web.HTTPError(410, "This confirmation link expired: set the address again on the notification "
                                     "choices page for a new mail.")
        return user, address, expires

    def write_error(self, status_code: int, **kwargs) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        says = exc.log_message if isinstance(exc, web.HTTPError) and exc.log_message else \
            "Something went wrong; try again in a minute."
        self.finish(PAGE.format(body=f"<p>{html.escape(says)}</p>"))

    async def get(self):
        user, address, _ = await self._valid()
        fields = "".join(f'<input type="hidden" name="{k}" value="{html.escape(self.get_argument(k), quote=True)}">'
                         for k in ("user", "address", "expires", "token"))
        self.finish(PAGE.format(body=(
            f"<p>Send <b>{html.escape(user)}</b>'s GPU hub notifications to <b>{html.escape(address)}</b>?</p>"
            f'<form method="post">{fields}<button type="submit">Confirm this address</button></form>')))

    async def post(self):
        user, address, expires = await self._valid()
        pool = self.settings["pool"]
        try:
            await ledger_call(directory.update_own_address, pool, user,
                              lambda raw: own_address.confirm(raw, address, expires, time.time()),
                              timeout=LEDGER_TIMEOUT)
        except own_address.NotPending as exc:
            raise web.HTTPError(409, str(exc)) from None
        log.info("%s confirmed an address of their own by its link", user)
        self.finish(PAGE.format(body=f"<p>Confirmed: {html.escape(user)}'s notification mails go to "
                                     f"<b>{html.escape(address)}</b> from now on.</p>"))


def routes(prefix: str) -> list[tuple]:
    return [(url_path_join(prefix, "notifications"), ChoicesPage),
            (url_path_join(prefix, "api", "notifications", "address"), AddressAPI),
            (url_path_join(prefix, signing.CONFIRM_PATH), Confirm)]
