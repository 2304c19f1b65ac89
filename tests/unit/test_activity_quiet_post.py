"""The images' gpuhub_activity extension: activity after a quiet spell posted to the hub at once."""

from __future__ import annotations

import asyncio
import importlib.util
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from traitlets.config import Configurable

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


def _extension():
    path = Path(__file__).resolve().parents[2] / "images" / "jupyter" / "gpuhub_activity" / "__init__.py"
    spec = importlib.util.spec_from_file_location("gpuhub_activity_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class WebApp:
    def __init__(self):
        self.last = T0

    def last_activity(self):
        return self.last


class ServerApp(Configurable):
    def __init__(self):
        super().__init__()
        self.web_app = WebApp()


def report(monkeypatch, url="http://hub.invalid/hub/api/users/alice/activity", quiet="10"):
    monkeypatch.setenv("GPUHUB_ACTIVITY_QUIET_AFTER", quiet)
    monkeypatch.setenv("JUPYTERHUB_ACTIVITY_URL", url)
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "the-servers-token")
    monkeypatch.setenv("JUPYTERHUB_SERVER_NAME", "")
    app = ServerApp()
    return app, _extension().QuietSpellReport(app)


def test_only_activity_after_a_quiet_spell_is_posted_and_once_per_spell(monkeypatch):
    app, r = report(monkeypatch)
    sent = []
    r._send = lambda when, quiet: sent.append((when, quiet))
    r.check()  # the server's start
    for seconds in (5, 9, 14):  # work with pauses under 10 s: the periodic reports tell the hub
        app.web_app.last = T0 + timedelta(seconds=seconds)
        r.check()
    assert sent == []
    app.web_app.last = T0 + timedelta(seconds=40)  # 26 s of quiet, then work
    r.check()
    assert sent == [(T0 + timedelta(seconds=40), 26.0)]
    r._posting = False  # (the post came back)
    for seconds in range(41, 60):  # the work goes on: no more posts
        app.web_app.last = T0 + timedelta(seconds=seconds)
        r.check()
        r.check()  # a look that finds nothing new
    assert len(sent) == 1


def test_off_without_the_hubs_threshold_or_token(monkeypatch):
    assert report(monkeypatch)[1].enabled
    assert not report(monkeypatch, quiet="0")[1].enabled
    assert not report(monkeypatch, url="")[1].enabled


def test_the_post_is_the_hubs_activity_api_with_the_servers_token_and_failures_do_not_raise(monkeypatch):
    from tornado import web
    from tornado.httpserver import HTTPServer
    from tornado.netutil import bind_sockets

    got = []

    class Activity(web.RequestHandler):
        def post(self):
            got.append((self.request.headers["Authorization"], json.loads(self.request.body)))
            self.set_status(204 if len(got) == 1 else 403)

    async def main():
        sockets = bind_sockets(0, "127.0.0.1")
        port = sockets[0].getsockname()[1]
        server = HTTPServer(web.Application([(r"/hub/api/users/alice/activity", Activity)]))
        server.add_sockets(sockets)
        _, r = report(monkeypatch, url=f"http://127.0.0.1:{port}/hub/api/users/alice/activity")
        ok = await r.post(T0, 30.0)
        refused = await r.post(T0, 30.0)  # the hub answers 403: logged
        server.stop()
        _, gone = report(monkeypatch, url=f"http://127.0.0.1:{port}/hub/api/users/alice/activity")
        unreachable = await gone.post(T0, 30.0)  # nothing listens: logged
        return ok, refused, unreachable, r._posting

    ok, refused, unreachable, posting = asyncio.run(main())
    assert (ok, refused, unreachable, posting) == (True, False, False, False)
    stamp = "2026-01-05T09:00:00Z"
    assert got[0] == ("token the-servers-token", {"last_activity": stamp, "servers": {"": {"last_activity": stamp}}})
