"""The end of a spawn: waiting for the server to answer, on real sockets on 127.0.0.1."""

from __future__ import annotations

import asyncio
import socket

from tornado import web
from tornado.httpserver import HTTPServer

from spawner.engines.common.readiness import wait_until_answering

# Stops a hung test; not a measure of speed.
SAFETY = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Redirect(web.RequestHandler):
    def get(self):
        self.redirect("/user/alice/lab")  # what jupyterhub-singleuser answers without a token


def test_returns_as_soon_as_a_late_server_answers():
    port = free_port()

    async def go():
        async def start_later():
            await asyncio.sleep(0.5)  # the server comes late: the wait must see it when it does
            server = HTTPServer(web.Application([(r"/.*", Redirect)]))
            server.listen(port, "127.0.0.1")
            return server

        starter = asyncio.ensure_future(start_later())
        # An hour's timeout: returning at all means it saw the server (SAFETY only stops a hang).
        answered = await asyncio.wait_for(
            wait_until_answering(f"http://127.0.0.1:{port}/user/alice/", timeout=3600), SAFETY)
        (await starter).stop()
        return answered

    assert asyncio.run(go()) is True


def test_gives_up_at_once_when_the_container_is_gone():
    port = free_port()  # nothing will ever listen here

    async def not_running():
        return False

    async def go():
        # An hour's timeout: returning at all means it gave up because the
        # container is gone, so the hub reports the failed spawn at once.
        return await asyncio.wait_for(
            wait_until_answering(f"http://127.0.0.1:{port}/", timeout=3600, is_running=not_running), SAFETY)

    assert asyncio.run(go()) is False
