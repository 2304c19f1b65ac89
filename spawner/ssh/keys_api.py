"""The gpu-ssh service's page and API: a person's registered SSH keys, and how to connect.

GET  /services/gpu-ssh/              the page: keys, the ~/.ssh/config snippet, a form to add one
GET  /services/gpu-ssh/api/keys      {"keys": [...]}, the caller's own
POST /services/gpu-ssh/api/keys      {"key": "ssh-ed25519 AAAA... comment"} -> 201 {"key": {...}}
DELETE /services/gpu-ssh/api/keys/FINGERPRINT (as shown, SHA256:...) -> 204

Only one's own keys: the hub's OAuth login or a hub API token says who is asking.  The
page's form posts to the same handlers (the hub's XSRF token checked on cookie logins).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from urllib.parse import unquote

from jinja2 import Environment, FileSystemLoader, select_autoescape
from jupyterhub.services.auth import HubOAuthCallbackHandler, HubOAuthenticated
from jupyterhub.utils import url_path_join
from tornado import web

from ..service_auth import AsksTheHubFirst
from .key_store import KeyRefused, KeyStore

log = logging.getLogger("gpu-ssh")
TEMPLATES = Path(__file__).with_name("templates")
MAX_BODY = 64 * 1024
HUB_AUTH_TIMEOUT = 10.0


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
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"status": status_code, "message": message}))


class KeysAPI(JSONHandler):
    def get(self):
        self.write_json({"keys": [k.public() for k in self.store.keys(self.me())]})

    def post(self):
        name = self.me()
        if len(self.request.body) > MAX_BODY:
            raise web.HTTPError(413, f"The request is over {MAX_BODY} bytes")
        line = self.get_body_argument("key", None)
        if line is None:
            try:
                line = (json.loads(self.request.body or b"{}") or {}).get("key")
            except (ValueError, AttributeError):
                raise web.HTTPError(400, 'Send JSON {"key": "ssh-ed25519 AAAA... comment"}') from None
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


class Page(Base):
    @web.authenticated
    def get(self):
        name = self.me()
        s = self.settings
        context = dict(name=name, keys=[k.public() for k in self.store.keys(name)], prefix=s["prefix"],
                       port=s["ssh_port"], host=s["ssh_host"] or self.request.host.split(":")[0],
                       max_keys=s["max_keys"], xsrf=self.xsrf_token.decode() if isinstance(self.xsrf_token, bytes)
                       else self.xsrf_token, login_host_alias="gpuhub")
        self.finish(s["jinja"].get_template("ssh.html").render(**context))


class OAuthCallback(HubOAuthCallbackHandler):
    pass


def make_app(store: KeyStore, prefix: str, ssh_port: int, ssh_host: str, max_keys: int) -> web.Application:
    jinja = Environment(loader=FileSystemLoader(str(TEMPLATES)), autoescape=select_autoescape(default=True))
    api = url_path_join(prefix, "api", "keys")
    return web.Application(
        [
            (prefix, Page),
            (url_path_join(prefix, "oauth_callback"), OAuthCallback),
            (api, KeysAPI),
            (api + r"/([^/]+)", KeyAPI),
        ],
        key_store=store, prefix=prefix, ssh_port=ssh_port, ssh_host=ssh_host, max_keys=max_keys, jinja=jinja,
        cookie_secret=os.urandom(32), xsrf_cookies=False,
    )
