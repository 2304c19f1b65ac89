"""Admin actions of the pool page and its API: drain/undrain, end a lease, action scripts.

Drain, undrain and ending leases need the custom:gpu-pool:admin scope; action
scripts need custom:gpu-pool:exec (granted to no one by default).  Each leaves an
audit record (who, what, when) in the ledger; a script's keeps the whole script
under its SHA-256, and a second record its per-server exit codes.  On the page
every action goes through a confirmation page (`confirm`, then a POST with the
hub's XSRF token to `actions/<action>`); a script's confirmation only from the
page's POST, and the script then runs in exactly the servers it listed.  The API
(`api/leases/<id>/end`, `api/exec`, `api/exec/<id>`) takes a hub API token and
answers JSON: a fan-out longer than a client waits answers 202 with a run id.
The `done` message on the page after an action is signed by the service, so a
link cannot make the page say something else.  Running a script by the browser's cookie (the
page's confirmation, or api/exec posted with the cookie) also needs the admin's password,
checked by the hub's authenticator (reauth.py): without `subdomain_host` a page in any user's
server shares the hub's origin and could read the XSRF token, never the password.  A request
with a hub API token in its header (`gpu-pool exec`) is not asked.
"""

from __future__ import annotations

import asyncio
import json
import logging
from urllib.parse import urlencode

from jupyterhub.utils import url_path_join
from tornado import web

from ...pool.ledger.off_loop import ledger_call
from ...pool.models import EndReason, PoolError
from ...reauth import PASSWORD_FIELD, token_authenticated
from ...services.hub_api import HubAPI, HubUnavailable
from .. import ADMIN_SCOPE, scripts, views
from ..service_config import PoolPageSettings
from .base import LEDGER_TIMEOUT, NO_EXEC, APIHandler, BaseHandler

log = logging.getLogger("gpu-pool-page")


class ActionError(web.HTTPError):
    """An action refused with a message for the admin (4xx) or the hub failing (502)."""

    def __init__(self, status: int, message: str):
        super().__init__(status, "%s", message)
        self.message = message


def xsrf_of(handler) -> str:
    """The hub's XSRF token for this page's forms (HubOAuth checks it on cookie-authenticated POSTs)."""
    token = handler.xsrf_token
    return token.decode() if isinstance(token, bytes) else token


def hub_api(handler) -> HubAPI:
    return handler.settings.setdefault("hub_api", HubAPI())


def server_route(handler) -> scripts.ServerRoute:
    if "server_route" not in handler.settings:
        page = handler.settings.get("page") or PoolPageSettings()
        handler.settings["server_route"] = scripts.ServerRoute(
            page.proxy_url, hub_api(handler), validate_cert=page.proxy_validate_cert)
    return handler.settings["server_route"]


async def running(handler) -> list:
    try:
        return await hub_api(handler).active_servers()
    except HubUnavailable as exc:
        raise ActionError(502, str(exc)) from None


def lease_id_of(raw) -> int:
    try:
        value = int(raw)
        if value < 1:
            raise ValueError
        return value
    except (TypeError, ValueError):
        raise ActionError(400, f"Not a lease id: {raw!r}") from None


async def end_lease(handler, viewer: views.Viewer, raw_id) -> dict:
    """Stop the server holding lease `raw_id` through the hub; its lease then ends with reason admin."""
    lease = await handler.ledger(handler.pool.lease, lease_id_of(raw_id))
    if lease is None:
        raise ActionError(404, f"No lease {raw_id} in the ledger")
    if lease.ended_at is not None:
        raise ActionError(409, f"Lease {lease.id} already ended ({lease.end_reason})")
    server = next((s for s in await running(handler) if s.user == lease.user and s.name == lease.server_name), None)
    if server is None:
        raise ActionError(409, f"Lease {lease.id} has no running server in the hub; the reconciler ends it")
    await handler.ledger(handler.pool.record, viewer.name, "end-lease",
                         f"lease {lease.id} of {server.label} ({len(lease.gpu_uuids)} GPU(s))", lease.host)
    # The spawner reads this when the stop arrives, and ends the lease `admin`.
    await handler.ledger(handler.pool.record_end_intent, lease.id, EndReason.ADMIN, viewer.name)
    try:
        stopped = await hub_api(handler).stop_server(lease.user, lease.server_name)
    except HubUnavailable as exc:
        raise ActionError(502, str(exc)) from None
    log.info("%s: ended lease %d of %s (reason %s)", viewer.name, lease.id, server.label, EndReason.ADMIN.value)
    return {"lease": views.lease_row(lease), "user": lease.user, "server_name": lease.server_name,
            "stopped": stopped}


# What POST api/exec reads; anything else is refused (as the jobs API does).  The password only
# when the request comes with the browser's cookie (recheck_password).
EXEC_FIELDS = ("script", "timeout", "profile", "group", "users", PASSWORD_FIELD)


async def recheck_password(handler, viewer: views.Viewer, password) -> None:
    """The admin's password again before a script runs, unless a hub API token (which a page of
    the hub's origin does not hold) identified the request: a 403 or 429 otherwise, and nothing runs."""
    if token_authenticated(handler):
        return
    await handler.settings["recheck"].check(viewer.name, password if isinstance(password, str) else None)


def exec_request(args: dict) -> tuple[str, int, scripts.Target]:
    try:
        script, timeout = scripts.check_script(args.get("script"), args.get("timeout", 60))
        return script, timeout, scripts.parse_target(args.get("profile"), args.get("group"), args.get("users"))
    except scripts.BadScript as exc:
        raise ActionError(400, str(exc)) from None


async def exec_targets(handler, target: scripts.Target) -> list:
    servers = scripts.select_servers(await running(handler), target)
    if not servers:
        raise ActionError(404, f"No running server of {target.describe()}")
    return servers


def run_store(handler) -> scripts.RunStore:
    return handler.settings.setdefault("runs", scripts.RunStore())


# An audit record of a script may hold the whole script (the ledger's other records are cut at 2,000).
AUDIT_SCRIPT_LIMIT = 2000 + scripts.MAX_SCRIPT_BYTES


async def start_exec(handler, viewer: views.Viewer, script: str, timeout: int, target: scripts.Target,
                     servers: list, gone: tuple[str, ...] = ()) -> scripts.Run:
    """Start a run of `script` in `servers` (in the background); `gone`: confirmed servers that
    stopped since, reported as not run.  The audit gets the whole script before anything runs."""
    run = run_store(handler).start(viewer.name, target.describe(), servers, script, timeout)
    run.servers += list(gone)
    labels = ", ".join(run.servers)
    await handler.ledger(handler.pool.record, viewer.name, "exec",
                         f"{target.describe()}: {len(run.servers)} server(s) ({labels}), timeout {timeout} s, "
                         f"run {run.id}, script sha256 {run.script_sha256}:\n{script}",
                         detail_limit=AUDIT_SCRIPT_LIMIT)
    for label in gone:
        run.finish_one(scripts.Result(label, None, "", error="stopped since the script was confirmed; not run"))
    pool, route = handler.pool, server_route(handler)

    async def body() -> None:
        try:
            if servers:
                await scripts.run_everywhere(route, servers, script, timeout, on_result=run.finish_one)
        finally:
            failed = [label for label, r in run.results.items() if r.exit_code != 0]
            try:
                await ledger_call(pool.record, viewer.name, "exec-done",
                                  f"run {run.id}, script sha256 {run.script_sha256}: {run.exit_codes()}",
                                  timeout=LEDGER_TIMEOUT, detail_limit=AUDIT_SCRIPT_LIMIT)
            except Exception:
                log.exception("Could not write the exit codes of run %s to the audit", run.id)
            run.end()
            log.info("%s: ran script %s (run %s) in %d server(s) of %s; failed: %s", viewer.name,
                     run.script_sha256[:12], run.id, len(run.servers), run.target, ", ".join(failed) or "none")

    run.task = asyncio.create_task(body())
    return run


def answers_at_once(servers: int, timeout: int) -> bool:
    """Whether a client should wait for the whole fan-out (else it gets a run id)."""
    return scripts.expected_seconds(servers, timeout) <= scripts.CLIENT_WAIT


def run_reply(handler, run: scripts.Run) -> dict:
    url = url_path_join(handler.settings["prefix"], "api", "exec", run.id)
    return {"id": run.id, "url": url, "target": run.target, "timeout": run.timeout,
            "script_sha256": run.script_sha256, "servers": sorted(run.servers),
            "message": f"Running in {len(run.servers)} server(s); GET {url} for the results as they come"}


async def set_drain(handler, viewer: views.Viewer, uuid: str, host: str | None, drain: bool) -> dict:
    fn = handler.pool.drain if drain else handler.pool.undrain
    try:
        status = await handler.ledger(fn, uuid, host, by=viewer.name)
    except PoolError as exc:
        raise ActionError(exc.status_code if exc.status_code < 500 else 503, str(exc)) from None
    log.info("%s: %s GPU %s on %s", viewer.name, "drain" if drain else "undrain", status.gpu.uuid, status.gpu.host)
    return views.gpu_row(status, viewer)


# --- the REST API -----------------------------------------------------------


class EndLeaseAPI(APIHandler):
    async def post(self, lease_id: str):
        viewer = self.require_viewer(admin=True)
        self.write_json(await end_lease(self, viewer, lease_id))


class ExecAPI(APIHandler):
    async def post(self):
        viewer = self.require_viewer(runs_scripts=True)
        try:
            args = json.loads(self.request.body or b"{}")
            if not isinstance(args, dict):
                raise ValueError
        except ValueError:
            raise ActionError(400, 'Send a JSON object: {"script", "timeout", and one of "profile", '
                                   '"group", "users"}') from None
        unknown = sorted(str(k)[:40] for k in args if k not in EXEC_FIELDS)
        if unknown:
            # A field not read would be dropped silently: {"user": "root"} would run as the server's user.
            raise ActionError(400, f"Unsupported field(s) {', '.join(repr(k) for k in unknown)}: api/exec "
                                   f"takes only {', '.join(EXEC_FIELDS)}")
        script, timeout, target = exec_request(args)
        await recheck_password(self, viewer, args.get(PASSWORD_FIELD))
        servers = await exec_targets(self, target)
        run = await start_exec(self, viewer, script, timeout, target, servers)
        if not answers_at_once(len(servers), timeout):
            self.write_json(run_reply(self, run), status=202)
            return
        if run.task is None:  # start_exec always sets it
            raise RuntimeError(f"Run {run.id} was started without its task")
        await asyncio.shield(run.task)
        self.write_json(run.as_dict())


class RunAPI(APIHandler):
    """A run's per-server results so far; `done` when every server has finished."""

    async def get(self, run_id: str):
        self.require_viewer(runs_scripts=True)
        run = run_store(self).get(run_id)
        if run is None:
            raise ActionError(404, f"No run {run_id} here: the service keeps its last {scripts.MAX_RUNS} runs "
                                   "(and none from before it restarted); the audit has every run's exit codes")
        self.write_json(run.as_dict())


# --- the page's confirmations and forms ---------------------------------------


class FormHandler(BaseHandler):
    """An admin's request from the page: HTML answers, errors shown on a page of their own."""

    def admin(self, action: str = "") -> views.Viewer:
        viewer = self.viewer()
        if action == "exec":
            if viewer is None or not viewer.runs_scripts:
                raise ActionError(403, NO_EXEC)
            return viewer
        if viewer is None or not viewer.admin:
            raise ActionError(403, f"This needs the {ADMIN_SCOPE} scope (a GPU pool admin)")
        return viewer

    def form(self) -> dict:
        # Only a POST's body: a link's query string never fills a confirmation or an action.
        body = self.request.method == "POST"
        return {k: (self.get_body_argument(k, "") if body else self.get_query_argument(k, "")) for k in
                ("action", "uuid", "host", "lease", "script", "timeout", "profile", "group", "users", "servers")}

    def render_page(self, name: str, **context) -> None:
        self.finish(self.settings["jinja"].get_template(name).render(
            base_url=self.settings["base_url"], prefix=self.settings["prefix"], viewer=self.viewer(),
            xsrf=xsrf_of(self), **context))

    def write_error(self, status_code: int, **kwargs) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        message = exc.message if isinstance(exc, ActionError) else self._reason
        if not isinstance(exc, ActionError) and isinstance(exc, web.HTTPError) and exc.log_message:
            message = exc.log_message % exc.args if exc.args else exc.log_message
        self.render_page("message.html", title="Not done", message=message)

    def done(self, message: str) -> None:
        """Back to the page, which shows `message`: signed here, so only the service's own show."""
        signed = self.create_signed_value("done", message).decode()
        self.redirect(self.settings["prefix"] + "?" + urlencode({"done": signed}))


class ConfirmHandler(FormHandler):
    """'Drain GPU 2 on node1?' and the like, with the button that does it."""

    @web.authenticated
    async def get(self):
        if self.get_query_argument("action", "") == "exec":
            # A link (or a page framing this one) could otherwise prefill an admin's script.
            raise ActionError(405, "An action script is confirmed only from the GPU pool page's own form "
                                   "(a POST); open the page and fill in the form there")
        await self.confirm()

    @web.authenticated
    async def post(self):
        await self.confirm()

    async def confirm(self):
        form = self.form()
        action = form["action"]
        self.admin(action)
        if action in ("drain", "undrain"):
            gpu = next((g for g in await self.ledger(self.pool.gpus)
                        if g.gpu.uuid == form["uuid"] and form["host"] in ("", g.gpu.host)), None)
            if gpu is None:
                raise ActionError(404, f"No GPU {form['uuid']} in the ledger")
            what = (f"{'Drain' if action == 'drain' else 'Undrain'} GPU {gpu.gpu.index} ({gpu.gpu.uuid}) "
                    f"on {gpu.gpu.host}?")
            note = ("It is lent to no one from now on; a lease it is in runs on." if action == "drain"
                    else "It is lent again from now on.")
            self.render_page("confirm.html", action=action, what=what, note=note, form=form, servers=[])
        elif action == "end-lease":
            lease = await self.ledger(self.pool.lease, lease_id_of(form["lease"]))
            if lease is None or lease.ended_at is not None:
                raise ActionError(404, f"No active lease {form['lease']}")
            what = (f"End lease {lease.id}: stop {lease.user}'s server "
                    f"\"{lease.server_name or 'default'}\" ({len(lease.gpu_uuids)} GPU(s) on {lease.host})?")
            self.render_page("confirm.html", action=action, what=what, form=form, servers=[],
                             note="The server stops now; unsaved work in it is lost. The lease ends with reason admin.")
        elif action == "exec":
            script, timeout, target = exec_request(form)
            servers = await exec_targets(self, target)
            form = {**form, "script": script, "servers": " ".join(s.label for s in servers)}
            self.render_page("confirm.html", action=action, form=form, servers=servers,
                             what=f"Run this script in {len(servers)} server(s) of {target.describe()}?",
                             note=f"It runs as each server's own user, for at most {timeout} s, in exactly "
                                  "these servers (one that stops before you confirm is left out).")
        else:
            raise ActionError(400, f"Unknown action {action!r}")


class ActionHandler(FormHandler):
    """The confirmed action; back to the page with what was done, or the script's results."""

    @web.authenticated
    async def post(self, action: str):
        viewer = self.admin(action)
        form = self.form()
        if action == "exec":
            await self.exec(viewer, form)
            return
        if action == "end-lease":
            done = await end_lease(self, viewer, form["lease"])
            message = f"Stopping {done['user']}'s server; its lease ends with reason admin."
        else:
            row = await set_drain(self, viewer, form["uuid"], form["host"] or None, action == "drain")
            message = f"GPU {row['index']} on {row['host']} is now {row['state']}."
        self.done(message)

    async def exec(self, viewer: views.Viewer, form: dict) -> None:
        """The confirmed script, in exactly the servers its confirmation listed."""
        script, timeout, target = exec_request(form)
        confirmed = list(dict.fromkeys(s for s in form["servers"].split() if s))
        if not confirmed:
            raise ActionError(400, "This script was not confirmed: fill in the form on the GPU pool page "
                                   "and confirm the list of servers it shows")
        await recheck_password(self, viewer, self.get_body_argument(PASSWORD_FIELD, None))
        now = {s.label: s for s in await running(self) if s.ready}
        servers = [now[label] for label in confirmed if label in now]
        gone = tuple(label for label in confirmed if label not in now)
        run = await start_exec(self, viewer, script, timeout, target, servers, gone)
        if not answers_at_once(len(servers), timeout):
            self.redirect(url_path_join(self.settings["prefix"], "exec", run.id))
            return
        if run.task is None:  # start_exec always sets it
            raise RuntimeError(f"Run {run.id} was started without its task")
        await asyncio.shield(run.task)
        self.render_page("exec_result.html", result=run.as_dict(), script=script, refresh=False)


class RunPage(FormHandler):
    """A run's results on a page of their own, reloading itself until every server has finished."""

    @web.authenticated
    async def get(self, run_id: str):
        self.admin("exec")
        run = run_store(self).get(run_id)
        if run is None:
            raise ActionError(404, f"No run {run_id} here (the service keeps its last {scripts.MAX_RUNS} runs); "
                                   "the audit on the GPU pool page has every run's exit codes")
        self.render_page("exec_result.html", result=run.as_dict(), script=None, refresh=not run.done)


def routes(prefix: str) -> list:
    api = url_path_join(prefix, "api")
    return [
        (url_path_join(api, "leases") + r"/([^/]+)/end", EndLeaseAPI),
        (url_path_join(api, "exec"), ExecAPI),
        (url_path_join(api, "exec") + r"/([A-Za-z0-9_-]+)", RunAPI),
        (url_path_join(prefix, "exec") + r"/([A-Za-z0-9_-]+)", RunPage),
        (url_path_join(prefix, "confirm"), ConfirmHandler),
        (url_path_join(prefix, "actions") + r"/(drain|undrain|end-lease|exec)", ActionHandler),
    ]
