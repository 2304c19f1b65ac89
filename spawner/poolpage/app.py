"""The gpu-pool service: a tornado app behind the hub's proxy at /services/gpu-pool/.

Users log in with the hub's own OAuth (HubOAuthenticated), or send a hub API
token (`Authorization: token ...`).  Every logged-in user may look; the
`custom:gpu-pool:admin` scope drains and undrains GPUs and sees everyone's usage.
This module holds the page, the first API handlers and the routes of all; the
base handlers live in handlers/base.py, which every API module in handlers/ imports.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from datetime import datetime
from pathlib import Path
from urllib.parse import urlparse

from jinja2 import Environment, FileSystemLoader, select_autoescape
from jupyterhub.utils import url_path_join
from tornado import web
from tornado.httpserver import HTTPServer

from ..inventory.kinds import inventory_from_config
from ..jobs.runner import JobRunner
from ..jobs.runner_settings import JobSettings
from ..notify import EmailNotifications, booking_watch, budget_watch, directory
from ..notify.browser import EXPIRE_EVERY_S, BrowserFeed
from ..notify.cull_warning import CullWatch
from ..notify.sender import Sender
from ..notify.settings import BrowserNotifications, Notifications, WebhookNotifications
from ..notify.watch import LedgerWatch
from ..notify.webhook import WebhookSender
from ..pool import ENV_DB_URL, GPUPool, ledger_env
from ..reauth import PasswordRecheck, authenticator_from_env
from ..services.lifecycle import EXIT_GRACE_SECONDS, exit_within, stop_when_the_hub_is_gone
from . import views
from .handlers import actions as actions_api
from .handlers import bookings as bookings_api
from .handlers import history as history_api
from .handlers import jobs as jobs_api
from .handlers import lab as lab_api
from .handlers import notifications as notifications_api
from .handlers import notify_page
from .handlers import schedules as schedules_api
from .handlers import wait as insight
from .handlers.actions import hub_api
from .handlers.base import APIHandler, BaseHandler, NotFound, OAuthCallback, log
from .handlers.log_streams import Followers
from .handlers.wait import settings_of as insight_settings
from .limits import PoolServiceLimits
from .server_reclaim import ServerReclaims
from .service_config import PoolPageSettings, load_service_config

TEMPLATES = Path(__file__).with_name("templates")
HISTORY_ROWS = 50
AUDIT_ROWS = 20


class GPUsAPI(APIHandler):
    async def get(self):
        viewer = self.require_viewer()
        gpus = views.gpu_rows(await self.call(self.pool.gpus), viewer)
        await insight.fill_readings(self, gpus)  # utilisation and memory in use, as the page shows
        self.write_json({"gpus": gpus})


class QueueAPI(APIHandler):
    async def get(self):
        viewer = self.require_viewer()
        self.write_json({"queue": views.queue_rows(await self.call(self.pool.queue), viewer)})


class UsageAPI(APIHandler):
    async def usage(self) -> tuple[dict, datetime | None, datetime | None]:
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
    def done_message(self) -> str | None:
        """What the last action said (`?done=`), only when the service itself signed it."""
        raw = self.get_query_argument("done", None)
        if not raw:
            return None
        value = web.decode_signed_value(self.application.settings["cookie_secret"], "done", raw,
                                        max_age_days=1)
        return value.decode("utf-8", "replace") if value else None

    @web.authenticated
    async def get(self):
        viewer = self.viewer()
        assert viewer is not None  # @web.authenticated: a current user
        gpus = views.gpu_rows(await self.ledger(self.pool.gpus), viewer)
        queue = views.queue_rows(await self.ledger(self.pool.queue), viewer)
        # The newest leases and the all-time total (rolled up): the page's cost never grows with history.
        mine = [views.lease_row(l) for l in await self.ledger(self.pool.recent_leases, viewer.name, HISTORY_ROWS)]
        use = await self.ledger(self.pool.recent_use)
        active = [views.lease_row(l) for l in await self.ledger(self.pool.leases, viewer.name)]
        audit = await self.ledger(self.pool.audit, AUDIT_ROWS) if viewer.admin else []
        context = dict(
            viewer=viewer, gpus=gpus, summary=views.summary(gpus), queue=queue,
            active=active, history=mine,
            total_hours=round(use.total_users.get(viewer.name, 0.0), 2), audit=audit,
            base_url=self.settings["base_url"], prefix=self.settings["prefix"],
            done=self.done_message(), xsrf=actions_api.xsrf_of(self))
        context.update(await insight.page_context(self, viewer, gpus, queue, context["active"]))
        context.update(await history_api.page_context(self, viewer))
        context.update(await bookings_api.page_context(self, viewer, gpus))
        self.finish(self.settings["jinja"].get_template("page.html").render(**context))


def _more_routes(prefix: str) -> list:
    """The handlers of the modules beside this one."""
    return (history_api.routes(prefix) + actions_api.routes(prefix) + insight.routes(prefix)
            + bookings_api.routes(prefix) + lab_api.routes(prefix) + notifications_api.routes(prefix)
            + notify_page.routes(prefix))


def make_app(pool: GPUPool, prefix: str, base_url: str, show_holders: bool, jobs=None,
             limits: PoolServiceLimits | None = None, page: PoolPageSettings | None = None,
             recheck: PasswordRecheck | None = None, notify: EmailNotifications | None = None,
             notify_events: Notifications | None = None,
             webhooks: WebhookNotifications | None = None,
             browser: BrowserNotifications | None = None) -> web.Application:
    limits = limits if limits is not None else PoolServiceLimits()
    page = page if page is not None else PoolPageSettings()
    jinja = Environment(loader=FileSystemLoader(str(TEMPLATES)), autoescape=select_autoescape(default=True))
    if jobs is not None:  # the page's Jobs section shows only where jobs run
        jinja.globals["job_rows"] = lambda viewer: jobs_api.job_rows(jobs, viewer)
        jinja.globals["job_profiles"] = lambda: jobs_api.job_profiles(jobs)
        jinja.globals["max_workers"] = jobs.limits.max_workers
    scheduler = jobs_api.make_scheduler(jobs)
    if scheduler is not None:
        jinja.globals["schedule_rows"] = lambda viewer: schedules_api.schedule_rows(scheduler, viewer)
    api = url_path_join(prefix, "api")
    notify_events = notify_events if notify_events is not None else Notifications()
    feed = BrowserFeed(pool, browser if browser is not None else BrowserNotifications(), notify_events)
    jinja.globals["browser_notifications"] = feed.settings
    return web.Application(
        [
            (prefix, PageHandler),
            (url_path_join(prefix, "oauth_callback"), OAuthCallback),
            (url_path_join(api, "gpus"), GPUsAPI),
            (url_path_join(api, "gpus") + r"/([^/]+)/(drain|undrain)", DrainAPI),
            (url_path_join(api, "queue"), QueueAPI),
            (url_path_join(api, "usage"), UsageAPI),
            (url_path_join(api, "usage.csv"), UsageCSV),
            (url_path_join(api, "audit"), AuditAPI),
            *_more_routes(prefix),
            *jobs_api.routes(prefix),
            *schedules_api.routes(prefix),
        ],
        pool=pool, jobs=jobs, scheduler=scheduler, jinja=jinja, prefix=prefix, base_url=base_url,
        show_holders=show_holders, limits=limits, page=page, followers=Followers(limits),
        recheck=recheck or PasswordRecheck(None), lab_profiles=lab_api.lab_profiles(jobs, page),
        cookie_secret=os.urandom(32), xsrf_cookies=False, default_handler_class=NotFound,
        notify=notify if notify is not None else EmailNotifications(), notify_key=_key_of(pool),
        notify_events=notify_events, browser_feed=feed,
        webhooks=webhooks if webhooks is not None else WebhookNotifications(),
    )


def _key_of(pool: GPUPool):
    """The unsubscribe links' key, read from the ledger once (on the ledger's threads)."""
    found: list[bytes] = []

    def key() -> bytes:
        if not found:
            found.append(directory.secret(pool))
        return found[0]
    return key


def bridge_ip(app: web.Application) -> str:
    """The hub's address on the containers' network, where the notebook servers reach the service
    (their JupyterLab's GPU status, their jobs); "" when it listens on 127.0.0.1 only."""
    runner = app.settings.get("jobs")
    return app.settings["page"].bridge_ip or (runner.settings.bridge_ip if runner is not None else "")


async def serve(app: web.Application, port: int) -> None:
    """Listen on 127.0.0.1:`port`, and for the containers on the hub's bridge address, until
    SIGINT or SIGTERM (the hub stops services with SIGINT, even when it was started with SIGINT
    ignored).  Before it, while the service starts, either signal ends it at once
    (early_stop.py); after it, the process ends within EXIT_GRACE_SECONDS."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    watchdog = asyncio.create_task(stop_when_the_hub_is_gone("gpu-pool", log))
    server = HTTPServer(app, xheaders=True)
    server.listen(port, "127.0.0.1")
    log.info("GPU pool page on http://127.0.0.1:%s%s", port, app.settings["prefix"])
    bridge, address = None, bridge_ip(app)
    if address:
        bridge = HTTPServer(app)  # no xheaders: containers cannot claim another address
        bridge.listen(port, address)
        log.info("For the notebook servers on http://%s:%s%s", address, port, app.settings["prefix"])
    stop_jobs = await jobs_api.start_jobs(app)
    sender = Sender(app.settings["pool"], app.settings["notify"], app.settings["prefix"],
                    url_path_join(app.settings["page"].proxy_url, app.settings["base_url"]),
                    hub=hub_api(app), events=app.settings["notify_events"])
    sender.start()
    hook_sender = WebhookSender(app.settings["pool"], app.settings["webhooks"], app.settings["prefix"],
                                url_path_join(app.settings["page"].proxy_url, app.settings["base_url"]),
                                hub=hub_api(app), events=app.settings["notify_events"],
                                public_url=app.settings["notify"].public_url)
    hook_sender.start()
    feed = app.settings["browser_feed"]
    watch = CullWatch(app.settings["pool"], hub_api(app), insight_settings(app).cull_rules,
                      app.settings["notify_events"])
    every = app.settings["notify_events"].cull_check_every
    ledger_watches = [LedgerWatch(app.settings["pool"], every, budget_watch.run_once,
                                  "GPU-hour budget event(s) queued"),
                      LedgerWatch(app.settings["pool"], every, booking_watch.run_once, "booking event(s) queued")]
    expiry = LedgerWatch(app.settings["pool"], EXPIRE_EVERY_S, feed.expire, "browser notification(s) expired")
    expiry.start()
    reclaims = ServerReclaims(app.settings["pool"], hub_api(app))  # borrowed servers asked back
    reclaims.start()
    if app.settings["notify"].enabled or app.settings["webhooks"].enabled or feed.settings.enabled:
        watch.start()  # (no channel: nobody to warn)
        for w in ledger_watches:
            w.start()
    await stop.wait()
    # Armed first: whatever below stalls (a loop that does not end, a call without an answer),
    # the process leaves within the grace of its stop, not at the hub's SIGTERM 30 s later.
    exit_within(EXIT_GRACE_SECONDS, "gpu-pool", log)
    for w in ledger_watches:
        await w.stop()
    await watch.stop()
    await expiry.stop()
    await reclaims.stop()
    await hook_sender.stop()
    await sender.stop()
    server.stop()
    if bridge is not None:
        bridge.stop()
    await stop_jobs()
    watchdog.cancel()
    log.info("GPU pool page stopped")


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="[%(levelname)s %(asctime)s gpu-pool-page] %(message)s")
    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/gpu-pool/")
    url = urlparse(os.environ.get("JUPYTERHUB_SERVICE_URL", "http://127.0.0.1:8091"))
    config = load_service_config()  # the hub's settings for this service (service_config.py)
    page, limits = PoolPageSettings(config=config), PoolServiceLimits(config=config)
    job_settings = JobSettings.from_config(config)
    inventory, runner = None, None
    if job_settings is not None:
        from ..engines import engine

        jobs_engine = engine(job_settings.engine)
        if jobs_engine.inventory_kind:
            # Jobs lease from what the engine's inventory says now (on Swarm: nodes that joined,
            # left, went down), as servers do.
            inventory = inventory_from_config(jobs_engine.inventory_kind, config=config)
    # (config: the hub's GPUPool.reclaim_grace, for the servers' reclaim; jobs bring all of GPUPool's.)
    pool = GPUPool(config=config, db_url=ledger_env(ENV_DB_URL), inventory=inventory,
                   **(job_settings.pool if job_settings else {}))
    if job_settings is not None:
        runner = JobRunner(pool, job_settings, jobs_engine.job_engine(job_settings))
    recheck = PasswordRecheck(authenticator_from_env(), timeout=limits.hub_auth_timeout)
    app = make_app(pool, prefix, os.environ.get("JUPYTERHUB_BASE_URL", "/"), page.show_holders,
                   jobs=runner, limits=limits, page=page,
                   recheck=recheck, notify=EmailNotifications(config=config),
                   notify_events=Notifications(config=config), webhooks=WebhookNotifications(config=config),
                   browser=BrowserNotifications(config=config))
    try:
        asyncio.run(serve(app, url.port or 80))
    finally:
        pool.close()
