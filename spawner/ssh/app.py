"""The gpu-ssh service process: the SSH gateway and the key page, until the hub stops it."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from urllib.parse import urlparse

from tornado.httpserver import HTTPServer

from ..reauth import PasswordRecheck
from ..services.lifecycle import stop_when_the_hub_is_gone
from .gateway import Gateway
from .gateway_settings import read_hand_over, read_secrets
from .hub_client import HubClient
from .key_store import KeyStore
from .keys_api import make_app
from .logins import Logins, load_authenticator

log = logging.getLogger("gpu-ssh")


async def serve() -> None:
    handed = read_hand_over()
    s = handed["gateway"]
    hub = HubClient(timeout=s["hub_timeout"])
    store = KeyStore(handed["state_dir"], s["max_keys_per_user"], s["max_key_bytes"], s["min_rsa_bits"])
    authenticator = load_authenticator(handed["authenticator_class"], handed["authenticator_config"],
                                       read_secrets(handed.get("authenticator_secrets") or {}))
    logins = Logins(authenticator, hub, store, s["hub_timeout"], handed.get("server_access"))
    gateway = Gateway(s, handed["state_dir"], logins, hub)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    watchdog = asyncio.create_task(stop_when_the_hub_is_gone("gpu-ssh", log))
    await gateway.start()
    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/gpu-ssh/")
    url = urlparse(os.environ.get("JUPYTERHUB_SERVICE_URL", "http://127.0.0.1:8092"))
    public_host = "" if s["address"] in ("0.0.0.0", "::", "127.0.0.1") else s["address"]
    recheck = PasswordRecheck(authenticator, timeout=s["hub_timeout"])
    page = HTTPServer(make_app(store, prefix, s["port"], public_host, s["max_keys_per_user"], recheck),
                      xheaders=True)
    page.listen(url.port or 80, "127.0.0.1")
    await stop.wait()
    page.stop()
    await gateway.stop()
    watchdog.cancel()
    log.info("SSH gateway stopped")


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="[%(levelname)s %(asctime)s gpu-ssh] %(message)s")
    logging.getLogger("asyncssh").setLevel(logging.WARNING)
    asyncio.run(serve())
