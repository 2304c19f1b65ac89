"""Admin actions of the pool page and its API: drain/undrain, end a lease, action scripts.

Each needs the custom:gpu-pool:admin scope and leaves an audit record (who,
what, when) in the ledger.  On the page every action goes through a
confirmation page (GET or POST `confirm`, then a POST with the hub's XSRF
token to `actions/<action>`); the API (`api/leases/<id>/end`, `api/exec`)
takes a hub API token and answers JSON.
"""

from __future__ import annotations

import hashlib
import json
import logging
from urllib.parse import urlencode

from jupyterhub.utils import url_path_join
from tornado import web

from ..labels import pool_identity
from ..pool.models import EndReason, PoolError
from . import ADMIN_SCOPE, scripts, views
from .handlers import APIHandler, BaseHandler
from .hubapi import HubAPI, HubUnavailable

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


def docker_client(handler):
    client = handler.settings.get("docker")
    if client is None:
        import docker

        client = handler.settings["docker"] = docker.from_env(timeout=60)
    return client


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
    try:
        stopped = await hub_api(handler).stop_server(lease.user, lease.server_name)
    except HubUnavailable as exc:
        raise ActionError(502, str(exc)) from None
    log.info("%s: ended lease %d of %s (reason %s)", viewer.name, lease.id, server.label, EndReason.ADMIN.value)
    return {"lease": views.lease_row(lease), "user": lease.user, "server_name": lease.server_name,
            "stopped": stopped}


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


async def exec_script(handler, viewer: views.Viewer, args: dict) -> dict:
    """Run an action script in the target's running servers; per server its exit code and output."""
    script, timeout, target = exec_request(args)
    servers = await exec_targets(handler, target)
    digest = hashlib.sha256(script.encode()).hexdigest()[:12]
    first = script.strip().splitlines()[0][:80]
    await handler.ledger(handler.pool.record, viewer.name, "exec",
                         f"{target.describe()}: {len(servers)} server(s), timeout {timeout} s, "
                         f"script sha256 {digest}: {first}")
    results = await scripts.run_everywhere(docker_client(handler), pool_identity(handler.pool), servers,
                                           script, timeout)
    failed = [r.server for r in results if r.exit_code != 0]
    log.info("%s: ran script %s in %d server(s) of %s; failed: %s", viewer.name, digest, len(results),
             target.describe(), ", ".join(failed) or "none")
    return {"target": target.describe(), "timeout": timeout, "script_sha256": digest,
            "results": [r.as_dict() for r in results]}


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
        viewer = self.require_viewer(admin=True)
        try:
            args = json.loads(self.request.body or b"{}")
            if not isinstance(args, dict):
                raise ValueError
        except ValueError:
            raise ActionError(400, 'Send a JSON object: {"script", "timeout", and one of "profile", '
                                   '"group", "users"}') from None
        self.write_json(await exec_script(self, viewer, args))


# --- the page's confirmations and forms ---------------------------------------


class FormHandler(BaseHandler):
    """An admin's request from the page: HTML answers, errors shown on a page of their own."""

    def admin(self) -> views.Viewer:
        viewer = self.viewer()
        if viewer is None or not viewer.admin:
            raise ActionError(403, f"This needs the {ADMIN_SCOPE} scope (a GPU pool admin)")
        return viewer

    def form(self) -> dict:
        return {k: self.get_argument(k, "") for k in
                ("action", "uuid", "host", "lease", "script", "timeout", "profile", "group", "users")}

    def render_page(self, name: str, **context) -> None:
        self.finish(self.settings["jinja"].get_template(name).render(
            base_url=self.settings["base_url"], prefix=self.settings["prefix"], viewer=self.viewer(),
            xsrf=xsrf_of(self), **context))

    def write_error(self, status_code: int, **kwargs) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        message = exc.message if isinstance(exc, ActionError) else self._reason
        self.render_page("message.html", title="Not done", message=message)


class ConfirmHandler(FormHandler):
    """'Drain GPU 2 on node1?' and the like, with the button that does it."""

    @web.authenticated
    async def get(self):
        await self.confirm()

    @web.authenticated
    async def post(self):
        await self.confirm()

    async def confirm(self):
        self.admin()
        form = self.form()
        action = form["action"]
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
            _, timeout, target = exec_request(form)
            servers = await exec_targets(self, target)
            self.render_page("confirm.html", action=action, form=form, servers=servers,
                             what=f"Run this script in {len(servers)} server(s) of {target.describe()}?",
                             note=f"It runs as each server's own user, for at most {timeout} s.")
        else:
            raise ActionError(400, f"Unknown action {action!r}")


class ActionHandler(FormHandler):
    """The confirmed action; back to the page with what was done, or the script's results."""

    @web.authenticated
    async def post(self, action: str):
        viewer = self.admin()
        form = self.form()
        if action == "exec":
            result = await exec_script(self, viewer, form)
            self.render_page("exec_result.html", result=result, script=form["script"])
            return
        if action == "end-lease":
            done = await end_lease(self, viewer, form["lease"])
            message = f"Stopping {done['user']}'s server; its lease ends with reason admin."
        else:
            row = await set_drain(self, viewer, form["uuid"], form["host"] or None, action == "drain")
            message = f"GPU {row['index']} on {row['host']} is now {row['state']}."
        self.redirect(self.settings["prefix"] + "?" + urlencode({"done": message}))


def routes(prefix: str) -> list:
    api = url_path_join(prefix, "api")
    return [
        (url_path_join(api, "leases") + r"/([^/]+)/end", EndLeaseAPI),
        (url_path_join(api, "exec"), ExecAPI),
        (url_path_join(prefix, "confirm"), ConfirmHandler),
        (url_path_join(prefix, "actions") + r"/(drain|undrain|end-lease|exec)", ActionHandler),
    ]
