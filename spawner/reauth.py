"""The directory password asked again before an action another page could do in a visitor's name.

Without JupyterHub's `subdomain_host`, a page served from any user's server shares the hub's
origin: in a visitor's browser it can fetch the hub's and the services' pages with the
visitor's cookies, read their `_xsrf` and post their forms.  Two actions are worth more to such
a page than anything else a service here offers: registering an SSH key (a way in that
outlives the visit) and confirming an action script (code in other people's servers).  Both
ask for the visitor's password again, checked by the hub's own authenticator (the class and
settings the hub hands over, as for the SSH gateway's password logins): a page can read the
visitor's cookies' worth but never their password.

A request authenticated by a hub API token in its `Authorization` header (the CLI, a script)
is not asked: the token is the proof, and a page that lacks it cannot send it.  Failures are
bounded per user: after `max_failures` wrong passwords within `window` seconds every further
try is a 429 until the oldest has aged out, right or wrong, so a page cannot guess either.
The password is never logged and never kept.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import time
from collections import OrderedDict, deque
from pathlib import Path

from jupyterhub.utils import maybe_future
from tornado import web

log = logging.getLogger("gpuhub.reauth")

PASSWORD_FIELD = "password"
MSG_ASK = ("Type your password (the one you log in to the hub with) to confirm: another page open in "
           "your browser could otherwise do this in your name")
MSG_WRONG = "That is not your password; nothing was changed"
MSG_NO_CHECK = ("This hub cannot check your password here (the service was started without the hub's "
                "authenticator); ask the hub's operator")
MSG_HUB_SLOW = "Your password could not be checked in time; nothing was changed, try again in a minute"
# The gpu-pool service's variable naming the file the hub writes for it: the authenticator's class,
# settings and where its secrets are (ssh/gateway_settings.py, authenticator_hand_over).
AUTHENTICATOR_FILE_ENV = "GPUHUB_POOL_AUTHENTICATOR_FILE"
# At most this many users' failures are remembered; the one longest without a failure goes first.
CAPACITY = 10000


def token_authenticated(handler) -> bool:
    """Whether the hub identified this request by an API token it carried (header or URL),
    rather than by the browser's cookie: what HubAuth notes on the handler
    (tests/unit/test_upstream_contract.py)."""
    return bool(getattr(handler, "_token_authenticated", False))


def authenticator_from_env(environ=os.environ):
    """The hub's authenticator as the file AUTHENTICATOR_FILE_ENV names describes it; None
    without one (the service outside a hub: nothing is confirmed by password then)."""
    from .ssh.gateway_settings import read_secrets
    from .ssh.logins import load_authenticator

    path = environ.get(AUTHENTICATOR_FILE_ENV, "")
    if not path:
        return None
    try:
        handed = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        log.error("No password re-check: cannot read %s (%s)", path, exc)
        return None
    return load_authenticator(handed["authenticator_class"], handed["authenticator_config"],
                              read_secrets(handed.get("authenticator_secrets") or {}, environ))


class PasswordRecheck:
    """Checks a user's password with the hub's authenticator, within `timeout` seconds, at most
    `max_failures` wrong ones per user in `window` seconds."""

    def __init__(self, authenticator, timeout: float = 10.0, max_failures: int = 5, window: float = 900.0,
                 clock=time.monotonic):
        self.authenticator = authenticator
        self.timeout = timeout
        self.max_failures = max_failures
        self.window = window
        self.clock = clock
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def _recent(self, name: str, now: float) -> deque[float]:
        failures = self._failures.get(name, deque())
        while failures and now - failures[0] >= self.window:
            failures.popleft()
        return failures

    def _failed(self, name: str, now: float) -> None:
        failures = self._recent(name, now)
        failures.append(now)
        self._failures[name] = failures
        self._failures.move_to_end(name)
        while len(self._failures) > CAPACITY:
            self._failures.popitem(last=False)

    async def check(self, name: str, password: str | None) -> None:
        """Nothing when `password` is `name`'s; else an HTTPError the user reads: 403 (none or
        wrong: nothing changes), 429 (too many wrong ones lately), 503 (not checked in time)."""
        if self.authenticator is None:
            raise web.HTTPError(403, MSG_NO_CHECK)
        if not password:
            raise web.HTTPError(403, MSG_ASK)
        now = self.clock()
        failures = self._recent(name, now)
        if len(failures) >= self.max_failures:
            wait = math.ceil((failures[0] + self.window - now) / 60)
            raise web.HTTPError(429, f"{len(failures)} wrong passwords in the last {self.window / 60:g} "
                                     f"minutes: try again in {wait} minute(s); nothing was changed")
        try:
            model = await asyncio.wait_for(maybe_future(self.authenticator.get_authenticated_user(
                None, {"username": name, "password": password})), self.timeout)
        except TimeoutError:
            log.warning("The password re-check of %s did not finish in %g s", name[:64], self.timeout)
            raise web.HTTPError(503, MSG_HUB_SLOW) from None
        except web.HTTPError as refusal:  # a locked or blocked account: the authenticator says why
            model, message = None, refusal.log_message
        else:
            message = None
        who = (model.get("name") if isinstance(model, dict) else model) if model else None
        if who != name:
            self._failed(name, now)
            log.warning("%s gave a wrong password to confirm an action (%d in %g s)", name[:64],
                        len(self._recent(name, now)), self.window)
            raise web.HTTPError(403, message or MSG_WRONG)
        self._failures.pop(name, None)
