"""The images' gpuhub_activity extension: GET gpuhub/notifications asks the pool service's feed with
the server's own token, passes its bounds on (429 with its Retry-After), and asks once however many
tabs ask at the same moment (images/jupyter/gpuhub_activity/notify.py)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import socket
from pathlib import Path

from tornado import web
from tornado.httpserver import HTTPServer


def _module():
    path = Path(__file__).resolve().parents[2] / "images" / "jupyter" / "gpuhub_activity" / "notify.py"
    spec = importlib.util.spec_from_file_location("gpuhub_activity_notify_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Feed(web.RequestHandler):
    def initialize(self, seen, answer):
        self.seen, self.answer = seen, answer

    async def get(self):
        self.seen.append((self.request.path, self.request.headers.get("Authorization")))
        await asyncio.sleep(0.05)  # a slow feed: the tabs asking meanwhile must not ask again
        status, body, headers = self.answer
        self.set_status(status)
        for k, v in headers.items():
            self.set_header(k, v)
        self.finish(json.dumps(body))


async def _serve(answer):
    seen: list = []
    app = web.Application([(r"/services/gpu-pool/api/notifications/feed", Feed, {"seen": seen, "answer": answer})])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.setblocking(False)
    server = HTTPServer(app)
    server.add_sockets([sock])
    port = sock.getsockname()[1]
    return server, seen, f"http://127.0.0.1:{port}/services/gpu-pool/"


def _feed(module, url, token="the-servers-token"):
    return module.LabFeed(logging.getLogger("test"), {"GPUHUB_POOL_URL": url, "JUPYTERHUB_API_TOKEN": token})


def test_the_feed_is_asked_with_the_servers_token_once_for_tabs_asking_together():
    module = _module()

    async def run():
        event = {"id": 7, "event": "ready", "title": "Your GPU is ready", "body": "", "url": None}
        server, seen, url = await _serve((200, {"events": [event], "poll_after_s": 5.0}, {}))
        try:
            feed = _feed(module, url)
            answers = await asyncio.gather(feed.take(), feed.take(), feed.take())
        finally:
            server.stop()
        return seen, answers

    seen, answers = asyncio.run(run())
    assert seen == [("/services/gpu-pool/api/notifications/feed", "token the-servers-token")]
    assert [a[0] for a in answers] == [200, 200, 200]
    assert sorted(len(a[1]["events"]) for a in answers) == [0, 0, 1]  # the event once, in one answer


def test_the_feeds_limit_and_absence_are_passed_on():
    module = _module()

    async def run(answer):
        server, _, url = await _serve(answer)
        try:
            return await _feed(module, url).take()
        finally:
            server.stop()

    status, body = asyncio.run(run((429, {"status": 429, "message": "At most 60 asks"}, {"Retry-After": "60"})))
    assert status == 429 and body["poll_after_s"] == 60.0 and "429" in body["message"]
    status, body = asyncio.run(run((404, {"status": 404, "message": "off"}, {})))
    assert status == 404
    status, body = asyncio.run(run((500, {"status": 500}, {})))
    assert status == 502 and body["poll_after_s"] == module.BACKOFF_S


def test_a_server_not_started_by_the_pool_says_so_and_asks_nothing():
    module = _module()
    status, body = asyncio.run(module.LabFeed(logging.getLogger("test"), {}).take())
    assert status == 404 and "not started by the hub's GPU pool" in body["message"]


def test_the_feed_down_is_a_502_with_a_slow_retry():
    module = _module()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there
    status, body = asyncio.run(_feed(module, f"http://127.0.0.1:{port}/").take())
    assert status == 502 and body["poll_after_s"] == module.BACKOFF_S
