"""Who is connecting: a password checked by the hub's own authenticator, a hub API token given
as password, or a public key the person registered.  Every way ends in the same verdict: the
hub name and nothing else, or a refusal with the message the person sees.

The authenticator is the hub's class with the hub's settings (handed over by the hub), so
the directory decides as at the login form: allowed groups, disabled and locked accounts,
blocked users.  Key and token logins, proven without the directory password, go through
the same checks before anything starts: the authenticator's check_blocked_users, the
allowed users and groups (DirectoryAuthenticator.check_standing for the directory, which
also asks the directory about the account; check_allowed otherwise).  Every login, the
password's too, then needs the hub to know the user and the user's roles to hold access to
their own server (server_access.py), as the browser's way in does.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import OrderedDict
from dataclasses import dataclass
from importlib import import_module

from jupyterhub.utils import maybe_future
from tornado import web
from traitlets.config import Config

from .hub_client import HubClient, HubUnavailable
from .key_store import KeyStore
from .server_access import reaches_own_server

log = logging.getLogger("gpu-ssh")
# The shape of a hub API token (JupyterHub makes 32 hex digits); only those are tried as tokens.
TOKEN_SHAPE = re.compile(r"[0-9a-f]{32,64}")
MSG_HUB_DOWN = "The hub did not answer in time; try again in a minute."
MSG_NO_SERVER_SCOPE = ("That API token may not reach your server: make one with the `access:servers` "
                       "scope (or no scopes given, the default) on the hub's Token page.")
MSG_UNKNOWN_USER = ("You have not logged in to the hub yet: log in once in the browser (that sets up "
                    "your account), then connect again.")
MSG_BLOCKED = "Your account may not log in to the hub."
MSG_NOT_ALLOWED = "Your account is not among those allowed to use the hub."
MSG_NO_SERVER_ACCESS = ("Your account holds no access to its own server on the hub (its roles were "
                        "changed); ask the hub's admins.")


@dataclass(frozen=True)
class Verdict:
    name: str | None
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.name is not None


def load_authenticator(class_path: str, sections: dict, secrets: dict | None = None):
    """The hub's authenticator class with the hub's settings; `secrets` ({section: {option:
    value}}, settings.read_secrets) added to them."""
    module, _, name = class_path.rpartition(".")
    cls = getattr(import_module(module), name)
    merged = {section: dict(options) for section, options in sections.items()}
    for section, options in (secrets or {}).items():
        merged.setdefault(section, {}).update(options)
    return cls(config=Config(merged))


def may_reach_server(scopes, name: str) -> bool:
    wanted = {"access:servers", f"access:servers!user={name}", f"access:servers!server={name}/",
              "inherit"}
    return bool(wanted & set(scopes or ()))


# A key login's directory check is remembered this long: anyone may offer a person's public key
# (it is public), and without the cache each offer would cost a directory lookup.
STANDING_SECONDS = 30.0
STANDING_ENTRIES = 10000


class Logins:
    def __init__(self, authenticator, hub: HubClient, keys: KeyStore, timeout: float,
                 server_access: dict | None = None):
        self.authenticator = authenticator
        self.hub = hub
        self.keys = keys
        self.timeout = timeout
        # The hub's roles, as server_access.rules_from_roles made them (the hand-over); None:
        # the roles are not checked (a gateway outside a hub).
        self.server_access = server_access
        self._standings: OrderedDict[str, tuple[float, Verdict]] = OrderedDict()

    async def _bounded(self, coro):
        return await asyncio.wait_for(coro, self.timeout)

    async def _known_to_hub(self, name: str, allowed: bool = True) -> Verdict:
        """The hub's word: it knows the user, and their roles reach their own server.
        `allowed` False: the authenticator's allowed users did not name them, which the hub's
        `allow_existing_users` overrules for a user the hub has (as the hub itself does)."""
        user = await self._bounded(self.hub.user(name))
        if user is None:
            return Verdict(None, MSG_UNKNOWN_USER)
        if not allowed and not getattr(self.authenticator, "allow_existing_users", False):
            return Verdict(None, MSG_NOT_ALLOWED)
        if self.server_access is not None and not reaches_own_server(self.server_access, user):
            log.warning("SSH login of %s refused: their roles %s hold no access to their own server",
                        name[:64], user.get("roles"))
            return Verdict(None, MSG_NO_SERVER_ACCESS)
        return Verdict(name)

    async def _authenticator_says(self, call, fallback: str) -> str | None:
        """None when the authenticator's check passes, else the message to show."""
        try:
            passed = await self._bounded(maybe_future(call()))
        except web.HTTPError as refusal:
            return refusal.log_message or fallback
        return None if passed else fallback

    async def _standing(self, name: str) -> Verdict:
        now = time.monotonic()
        cached = self._standings.get(name)
        if cached is not None and now - cached[0] < STANDING_SECONDS:
            return cached[1]
        verdict = await self._fresh_standing(name)
        self._standings[name] = (now, verdict)
        self._standings.move_to_end(name)
        while len(self._standings) > STANDING_ENTRIES:
            self._standings.popitem(last=False)
        return verdict

    async def _fresh_standing(self, name: str) -> Verdict:
        """A login proven without the password: the checks a password login passes through the
        authenticator (blocked, allowed), then the hub's (known, own server reachable)."""
        a = self.authenticator
        model = {"name": name, "auth_state": None}
        message = await self._authenticator_says(lambda: a.check_blocked_users(name, model), MSG_BLOCKED)
        if message:
            return Verdict(None, message)
        allowed = True
        check = getattr(a, "check_standing", None)
        if check is not None:
            message = await self._bounded(check(name))
            if message:
                return Verdict(None, message)
        elif not getattr(a, "allow_all", False):
            allowed = await self._authenticator_says(lambda: a.check_allowed(name, model), MSG_NOT_ALLOWED) is None
            if not allowed and not getattr(a, "allow_existing_users", False):
                return Verdict(None, MSG_NOT_ALLOWED)
        return await self._known_to_hub(name, allowed)

    async def password(self, username: str, password: str) -> Verdict:
        try:
            if TOKEN_SHAPE.fullmatch(password):
                verdict = await self.token(username, password)
                if verdict.ok or verdict.message:
                    return verdict
            try:
                model = await self._bounded(self.authenticator.get_authenticated_user(
                    None, {"username": username, "password": password}))
            except web.HTTPError as refusal:
                return Verdict(None, refusal.log_message or "")
            if not model:
                return Verdict(None)
            name = model["name"] if isinstance(model, dict) else str(model)
            return await self._known_to_hub(name)
        except (TimeoutError, HubUnavailable) as exc:
            log.warning("Login of %r not checked: %s", username[:64], exc or "timed out")
            return Verdict(None, MSG_HUB_DOWN)

    async def token(self, username: str, token: str) -> Verdict:
        """A hub API token as password: it must belong to `username` and reach their server.
        An empty verdict (no name, no message): not a token of the hub (try it as a password)."""
        owner = await self._bounded(self.hub.token_owner(token))
        if owner is None or owner.get("kind", "user") != "user":
            return Verdict(None)
        if owner.get("name") != self.authenticator.normalize_username(username):
            return Verdict(None, "")  # another person's token: refused like a wrong password
        if not may_reach_server(owner.get("scopes"), owner["name"]):
            return Verdict(None, MSG_NO_SERVER_SCOPE)
        return await self._standing(owner["name"])

    async def public_key(self, username: str, key) -> Verdict:
        name = self.authenticator.normalize_username(username)
        if not self.keys.accepts(name, key):
            return Verdict(None)
        try:
            return await self._standing(name)
        except (TimeoutError, HubUnavailable) as exc:
            log.warning("Key login of %r not checked: %s", name[:64], exc or "timed out")
            return Verdict(None, MSG_HUB_DOWN)
