"""The gpu-ssh service's page and API: a person's registered SSH keys, and how to connect.

GET  /services/gpu-ssh/              the page: keys, the ~/.ssh/config snippet, a form to add one
GET  /services/gpu-ssh/api/keys      {"keys": [...]}, the caller's own
POST /services/gpu-ssh/api/keys      {"key": "ssh-ed25519 AAAA... comment", "password": "..."} -> 201 {"key": {...}}
DELETE /services/gpu-ssh/api/keys/FINGERPRINT (as shown, SHA256:...) -> 204

Only one's own keys: the hub's OAuth login or a hub API token says who is asking.  The
page's form posts to the same handlers (the hub's XSRF token checked on cookie logins).
Adding a key by the browser's cookie also needs the person's password (reauth.py): without
`subdomain_host` another user's page shares the hub's origin and can read this page's XSRF
token, but not the password.  A request carrying a hub API token is not asked.  Keys added in
the last NEW_KEY_DAYS are shown at the top of the page, with when.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from urllib.parse import unquote

from jinja2 import Environment, FileSystemLoader, select_autoescape
from jupyterhub.services.auth import HubOAuthCallbackHandler, HubOAuthenticated
from jupyterhub.utils import url_path_join
from tornado import web

from ..reauth import PASSWORD_FIELD, PasswordRecheck, token_authenticated
from ..services.callers import AsksTheHubFirst
from .key_store import KeyRefused, KeyStore

log = logging.getLogger("gpu-ssh")
TEMPLATES = Path(__file__).with_name("templates")
MAX_BODY = 64 * 1024
HUB_AUTH_TIMEOUT = 10.0
# Keys added this recently are shown in a banner at the top of the page.
NEW_KEY_DAYS = 7


class Base(AsksTheHubFirst, HubOAuthenticated, web.RequestHandler):
    """Who is asking comes from the hub, asked asynchronously in prepare(): the same process
    relays SSH traffic, which must never wait on a blocking call to the hub."""

    def hub_auth_timeout(self) -> float:
        return HUB_AUTH_TIMEOUT

    def set_default_headers(self) -> None:
        self.set_header("X-Frame-Options", "DENY")
        self.set_header("Content-Security-Policy", "frame-ancestors 'none'")

    @property
    def store(self) -> KeyStore:
        return self.settings["key_store"]

    def me(self) -> str:
        user = self.current_user
        if not user:
            raise web.HTTPError(403, "Log in to the hub (or send a hub API token) first")
        return user["name"]


class JSONHandler(Base):
    def write_json(self, data, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(data))

    def write_error(self, status_code: int, **kwargs) -> None:
        message = self._reason
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, web.HTTPError) and exc.log_message:
            message = exc.log_message % exc.args if exc.args else exc.log_message
        if self.request.method == "POST" and self.get_body_argument("from_page", None) and self.current_user:
            # The page's form: the page again, saying what went wrong.
            self.finish(render_page(self, self.current_user["name"], error=message))
            return
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"status": status_code, "message": message}))


class KeysAPI(JSONHandler):
    def get(self):
        self.write_json({"keys": [k.public() for k in self.store.keys(self.me())]})

    async def post(self):
        name = self.me()
        if len(self.request.body) > MAX_BODY:
            raise web.HTTPError(413, f"The request is over {MAX_BODY} bytes")
        line = self.get_body_argument("key", None)
        password = self.get_body_argument(PASSWORD_FIELD, None)
        if line is None:
            try:
                body = json.loads(self.request.body or b"{}") or {}
                line, password = body.get("key"), body.get(PASSWORD_FIELD)
            except (ValueError, AttributeError):
                raise web.HTTPError(400, 'Send JSON {"key": "ssh-ed25519 AAAA... comment", '
                                         '"password": "your password"}') from None
        if not token_authenticated(self):
            await self.settings["recheck"].check(name, password if isinstance(password, str) else None)
        try:
            entry = self.store.add(name, line or "")
        except KeyRefused as exc:
            raise web.HTTPError(exc.status, str(exc)) from None
        log.info("%s registered SSH key %s", name, entry.fingerprint)
        if self.get_body_argument("from_page", None):
            self.redirect(self.settings["prefix"])
            return
        self.write_json({"key": entry.public()}, 201)


class KeyAPI(JSONHandler):
    def delete(self, fingerprint: str):
        name = self.me()
        fingerprint = unquote(fingerprint)
        if not self.store.remove(name, fingerprint):
            raise web.HTTPError(404, f"You have no key {fingerprint} registered")
        log.info("%s removed SSH key %s", name, fingerprint)
        self.set_status(204)
        self.finish()

    def post(self, fingerprint: str):  # the page's "remove" button (forms cannot DELETE)
        name = self.me()
        self.store.remove(name, unquote(fingerprint))
        self.redirect(self.settings["prefix"])


def render_page(handler: Base, name: str, error: str = "") -> str:
    s = handler.settings
    keys = [k.public() for k in handler.store.keys(name)]
    now = time.time()
    for k in keys:
        k["added_text"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(k["added"]))
    recent = [k for k in keys if now - k["added"] < NEW_KEY_DAYS * 86400]
    token = handler.xsrf_token
    context = dict(name=name, keys=keys, recent=recent, new_key_days=NEW_KEY_DAYS, prefix=s["prefix"],
                   port=s["ssh_port"], host=s["ssh_host"] or handler.request.host.split(":")[0],
                   max_keys=s["max_keys"], xsrf=token.decode() if isinstance(token, bytes) else token,
                   login_host_alias="gpuhub", error=error)
    return s["jinja"].get_template("ssh.html").render(**context)


class Page(Base):
    @web.authenticated
    def get(self):
        self.finish(render_page(self, self.me()))


class OAuthCallback(HubOAuthCallbackHandler):
    pass


def make_app(store: KeyStore, prefix: str, ssh_port: int, ssh_host: str, max_keys: int,
             recheck: PasswordRecheck) -> web.Application:
    jinja = Environment(loader=FileSystemLoader(str(TEMPLATES)), autoescape=select_autoescape(default=True))
    api = url_path_join(prefix, "api", "keys")
    return web.Application(
        [
            (prefix, Page),
            (url_path_join(prefix, "oauth_callback"), OAuthCallback),
            (api, KeysAPI),
            (api + r"/([^/]+)", KeyAPI),
        ],
        key_store=store, recheck=recheck, prefix=prefix, ssh_port=ssh_port, ssh_host=ssh_host, max_keys=max_keys,
        jinja=jinja,
        cookie_secret=os.urandom(32), xsrf_cookies=False,
    )
