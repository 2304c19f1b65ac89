"""The gpu-pool service: a tornado app behind the hub's proxy at /services/gpu-pool/.

Users log in with the hub's own OAuth (HubOAuthenticated), or send a hub API
token (`Authorization: token ...`).  Every logged-in user may look; the
`custom:gpu-pool:admin` scope drains and undrains GPUs and sees everyone's usage.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from pathlib import Path
from urllib.parse import urlparse

from jinja2 import Environment, FileSystemLoader, select_autoescape
from jupyterhub.services.auth import HubOAuthCallbackHandler, HubOAuthenticated
from jupyterhub.utils import url_path_join
from tornado import web
from tornado.httpserver import HTTPServer

from ..jobs.runner import JobRunner
from ..jobs.settings import JobSettings
from ..hub_service import stop_when_the_hub_is_gone
from ..ledger_io import ledger_call
from ..pool import GPUPool
from ..pool.models import InvalidRequest, PoolError, PoolUnavailable, UnknownGPU
from ..settings.parsing import env_bool
from . import ADMIN_SCOPE, views

log = logging.getLogger("gpu-pool-page")
# Seconds a ledger call may take before the page answers 503 (as the hub does).
LEDGER_TIMEOUT = 10.0
TEMPLATES = Path(__file__).with_name("templates")
HISTORY_ROWS = 50
AUDIT_ROWS = 20


class BaseHandler(HubOAuthenticated, web.RequestHandler):
    """A request of a logged-in hub user, who is a `views.Viewer`."""

    @property
    def pool(self) -> GPUPool:
        return self.settings["pool"]

    def viewer(self) -> views.Viewer | None:
        user = self.current_user
        if not user:
            return None
        return views.Viewer(name=user["name"], admin=ADMIN_SCOPE in set(user.get("scopes", ())),
                            show_holders=self.settings["show_holders"])

    async def ledger(self, fn, *args, **kwargs):
        """Run a (blocking) ledger call off the event loop, bounded like the hub's own."""
        return await ledger_call(fn, *args, timeout=LEDGER_TIMEOUT, **kwargs)


class APIHandler(BaseHandler):
    """JSON in, JSON out; errors are {"status", "message"}, never a traceback."""

    def require_viewer(self, admin: bool = False) -> views.Viewer:
        viewer = self.viewer()
        if viewer is None:
            raise web.HTTPError(403, "Log in to the hub (or send a hub API token) first")
        if admin and not viewer.admin:
            raise web.HTTPError(403, f"This needs the {ADMIN_SCOPE} scope (a GPU pool admin)")
        return viewer

    def write_json(self, data, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(data))

    def write_error(self, status_code: int, **kwargs) -> None:
        message = self._reason
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, web.HTTPError) and exc.log_message:
            message = exc.log_message % exc.args if exc.args else exc.log_message
        elif isinstance(exc, PoolError):
            message = str(exc)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"status": status_code, "message": message}))

    def log_exception(self, typ, value, tb):
        if isinstance(value, (web.HTTPError, PoolError)):
            log.warning("%s %s: %s", self.request.method, self.request.uri, value)
        else:
            super().log_exception(typ, value, tb)

    async def call(self, fn, *args, **kwargs):
        """A ledger call whose pool errors become HTTP errors with their message."""
        try:
            return await self.ledger(fn, *args, **kwargs)
        except UnknownGPU as exc:
            raise web.HTTPError(404, str(exc)) from None
        except InvalidRequest as exc:
            raise web.HTTPError(400, str(exc)) from None
        except PoolUnavailable as exc:
            raise web.HTTPError(503, str(exc)) from None

    def period(self):
        try:
            return views.usage_period(self.get_argument("since", None), self.get_argument("until", None))
        except views.BadInput as exc:
            raise web.HTTPError(400, str(exc)) from None


class GPUsAPI(APIHandler):
    async def get(self):
        viewer = self.require_viewer()
        self.write_json({"gpus": views.gpu_rows(await self.call(self.pool.gpus), viewer)})


class QueueAPI(APIHandler):
    async def get(self):
        viewer = self.require_viewer()
        self.write_json({"queue": views.queue_rows(await self.call(self.pool.queue), viewer)})


class UsageAPI(APIHandler):
    async def usage(self) -> tuple[dict, object, object]:
        viewer = self.require_viewer()
        since, until = self.period()
        return views.usage_for(await self.call(self.pool.usage, since, until), viewer), since, until

    async def get(self):
        usage, since, until = await self.usage()
        self.write_json({"since": since and since.isoformat(), "until": until and until.isoformat(), **usage})


class UsageCSV(UsageAPI):
    async def get(self):
        usage, _, _ = await self.usage()
        self.set_header("Content-Type", "text/csv; charset=utf-8")
        self.set_header("Content-Disposition", 'attachment; filename="gpu-usage.csv"')
        self.finish(views.usage_csv(usage))


class DrainAPI(APIHandler):
    async def post(self, uuid: str, action: str):
        viewer = self.require_viewer(admin=True)
        host = self.get_argument("host", None)
        fn = self.pool.drain if action == "drain" else self.pool.undrain
        status = await self.call(fn, uuid, host, by=viewer.name)
        log.info("%s: %s GPU %s on %s", viewer.name, action, status.gpu.uuid, status.gpu.host)
        self.write_json({"gpu": views.gpu_row(status, viewer)})


class AuditAPI(APIHandler):
    async def get(self):
        self.require_viewer(admin=True)
        self.write_json({"audit": await self.call(self.pool.audit, 100)})


class PageHandler(BaseHandler):
    @web.authenticated
    async def get(self):
        viewer = self.viewer()
        gpus = views.gpu_rows(await self.ledger(self.pool.gpus), viewer)
        queue = views.queue_rows(await self.ledger(self.pool.queue), viewer)
        history = await self.ledger(self.pool.history, viewer.name)
        mine = [views.lease_row(l) for l in reversed(history)]
        audit = await self.ledger(self.pool.audit, AUDIT_ROWS) if viewer.admin else []
        from . import actions_api, history_api, insight  # they import this module

        context = dict(
            viewer=viewer, gpus=gpus, summary=views.summary(gpus), queue=queue,
            active=[l for l in mine if l["ended_at"] is None], history=mine[:HISTORY_ROWS],
            total_hours=round(sum(l["gpu_hours"] for l in mine), 2), audit=audit,
            base_url=self.settings["base_url"], prefix=self.settings["prefix"],
            done=self.get_argument("done", None), xsrf=actions_api.xsrf_of(self))
        context.update(await insight.page_context(self, viewer, gpus, queue, context["active"]))
        context.update(await history_api.page_context(self, viewer))
        self.finish(self.settings["jinja"].get_template("page.html").render(**context))


def _more_routes(prefix: str) -> list:
    """The handlers of the modules beside this one (they import its base handlers)."""
    from . import actions_api, history_api, insight

    return history_api.routes(prefix) + actions_api.routes(prefix) + insight.routes(prefix)


def make_app(pool: GPUPool, prefix: str, base_url: str, show_holders: bool, jobs=None) -> web.Application:
    from . import jobs_api  # imports this module's handlers

    jinja = Environment(loader=FileSystemLoader(str(TEMPLATES)), autoescape=select_autoescape(default=True))
    if jobs is not None:  # the page's Jobs section shows only where jobs run
        jinja.globals["job_rows"] = lambda viewer: jobs_api.job_rows(jobs, viewer)
    api = url_path_join(prefix, "api")
    return web.Application(
        [
            (prefix, PageHandler),
            (url_path_join(prefix, "oauth_callback"), HubOAuthCallbackHandler),
            (url_path_join(api, "gpus"), GPUsAPI),
            (url_path_join(api, "gpus") + r"/([^/]+)/(drain|undrain)", DrainAPI),
            (url_path_join(api, "queue"), QueueAPI),
            (url_path_join(api, "usage"), UsageAPI),
            (url_path_join(api, "usage.csv"), UsageCSV),
            (url_path_join(api, "audit"), AuditAPI),
            *_more_routes(prefix),
            *jobs_api.routes(prefix),
        ],
        pool=pool, jobs=jobs, jinja=jinja, prefix=prefix, base_url=base_url, show_holders=show_holders,
        cookie_secret=os.urandom(32), xsrf_cookies=False,
    )


async def serve(app: web.Application, port: int) -> None:
    """Listen on 127.0.0.1:`port` until SIGINT or SIGTERM (the hub stops services with SIGINT,
    even when it was started with SIGINT ignored)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    watchdog = asyncio.create_task(stop_when_the_hub_is_gone("gpu-pool", log))
    server = HTTPServer(app, xheaders=True)
    server.listen(port, "127.0.0.1")
    log.info("GPU pool page on http://127.0.0.1:%s%s", port, app.settings["prefix"])
    from .jobs_api import start_jobs

    stop_jobs = await start_jobs(app, port)
    await stop.wait()
    server.stop()
    await stop_jobs()
    watchdog.cancel()
    log.info("GPU pool page stopped")


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="[%(levelname)s %(asctime)s gpu-pool-page] %(message)s")
    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/gpu-pool/")
    url = urlparse(os.environ.get("JUPYTERHUB_SERVICE_URL", "http://127.0.0.1:8091"))
    job_settings = JobSettings.from_env(os.environ)
    pool = GPUPool(db_url=os.environ["GPUHUB_POOL_DB_URL"], **(job_settings.pool if job_settings else {}))
    app = make_app(pool, prefix, os.environ.get("JUPYTERHUB_BASE_URL", "/"),
                   env_bool(os.environ, "GPUHUB_POOL_PAGE_SHOW_HOLDERS", False),
                   jobs=JobRunner(pool, job_settings) if job_settings else None)
    try:
        asyncio.run(serve(app, url.port or 80))
    finally:
        pool.close()
