"""gpuhub_scripts: a jupyter-server extension that runs an admin's action script in this server.

Installed and enabled in GPU JupyterHub's notebook images (with gpuhub_activity).  The
gpu-pool service sends `POST <server>/api/gpuhub/script` with {"script", "timeout"}
through the hub's proxy, for a pool admin holding `custom:gpu-pool:exec`, with a token
it had the hub make for this request: owned by this server's user, scoped to this one
server, deleted after the request (JupyterHub's single-user auth lets it in as it would
the user).  The service's own token never comes here.

The script runs as this server's own process user (never root: a server running as
root refuses), with exactly the server's rights, under coreutils' `timeout` in a
session of its own (a deadline here kills the whole group should `timeout` not end
it); its output (stdout and stderr) is read as it comes and only its first
`OUTPUT_CAP` bytes are kept, so a chatty script runs to its end and the answer stays
small.  The same on one Docker host and on every Swarm node: the server already runs
on the right node as the right user, and no Docker engine is asked to exec anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal

__version__ = "1.0.0"
MAX_SCRIPT_BYTES = 64 * 1024
MAX_TIMEOUT = 3600
OUTPUT_CAP = 16 * 1024
CHUNK = 64 * 1024


async def run_script(script: str, timeout: int, cap: int = OUTPUT_CAP) -> dict:
    """{exit_code, output, truncated, timed_out} of `sh -c script` under `timeout`."""
    proc = await asyncio.create_subprocess_exec(
        "timeout", "-k", "5", str(timeout), "sh", "-c", script, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, start_new_session=True)
    kept = bytearray()
    more = False

    async def read() -> None:
        nonlocal more
        while chunk := await proc.stdout.read(CHUNK):
            room = cap - len(kept)
            if room > 0:
                kept.extend(chunk[:room])
            if len(chunk) > room:
                more = True

    try:
        await asyncio.wait_for(asyncio.gather(read(), proc.wait()), timeout + 15)
    except (asyncio.TimeoutError, asyncio.CancelledError):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
    code = proc.returncode
    return {"exit_code": code, "output": kept.decode("utf-8", errors="replace"), "truncated": more,
            "timed_out": code in (124, 137, -9)}


def script_handler():
    """The handler class (jupyter-server is imported only inside the server)."""
    from jupyter_server.base.handlers import APIHandler
    from tornado import web

    class ScriptHandler(APIHandler):
        auth_resource = "terminals"  # running a script is what a terminal does

        @web.authenticated
        async def post(self):
            if not self.authorizer.is_authorized(self, self.current_user, "execute", self.auth_resource):
                raise web.HTTPError(403, "This token may not run code in this server")
            if os.geteuid() == 0:
                raise web.HTTPError(403, "This server runs as root: scripts run only as a server's own user")
            try:
                body = json.loads(self.request.body or b"{}")
                script, timeout = body["script"], int(body.get("timeout", 60))
            except (ValueError, KeyError, TypeError):
                raise web.HTTPError(400, 'Send {"script": "...", "timeout": seconds}') from None
            if not isinstance(script, str) or not script.strip() or len(script.encode()) > MAX_SCRIPT_BYTES:
                raise web.HTTPError(400, f"The script must be 1 byte to {MAX_SCRIPT_BYTES // 1024} KiB")
            if not 1 <= timeout <= MAX_TIMEOUT:
                raise web.HTTPError(400, f"timeout must be between 1 and {MAX_TIMEOUT} seconds")
            try:
                result = await run_script(script, timeout)
            except FileNotFoundError:
                raise web.HTTPError(
                    501, "This image has no `timeout` command (coreutils), so no script runs here") from None
            self.log.info("Ran an action script (%d bytes): exit %s", len(script.encode()), result["exit_code"])
            self.finish(json.dumps(result))

    return ScriptHandler


def _jupyter_server_extension_points():
    return [{"module": "gpuhub_scripts"}]


def _load_jupyter_server_extension(serverapp):
    from jupyter_server.utils import url_path_join

    base = serverapp.web_app.settings.get("base_url", "/")
    serverapp.web_app.add_handlers(".*$", [(url_path_join(base, "api/gpuhub/script"), script_handler())])
