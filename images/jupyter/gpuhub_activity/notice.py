"""Tell the open JupyterLab tabs why this server stops, as it stops (an admin ended its GPU lease).

An admin ending a lease (or the culler) has the hub stop the server's container: by the time
gpuhub-lab's next status poll would ask, the server is gone and the tab could only say that it
lost it.  On SIGTERM jupyter-server stops listening for new connections but keeps the open ones,
and calls its extension apps' `stop_extension` before it shuts the kernels down.  This app then
asks the pool service once why (api/lab's `ending`: the reason the pool page or the culler
recorded before asking the hub to stop the server) and emits an event on jupyter-server's event
bus, which JupyterLab's open event socket carries to every tab; gpuhub-lab shows it as a notice.
"""

from __future__ import annotations

import asyncio

from jupyter_server.extension.application import ExtensionApp

SCHEMA_ID = "urn:gpuhub:lab:server-stopping"
SCHEMA = {
    "$id": SCHEMA_ID,
    "version": "1",
    "title": "This server is stopping",
    "description": "Why the hub stops this server (its GPU lease was ended), for the open JupyterLab tabs.",
    "type": "object",
    "properties": {
        "reason": {"type": "string", "title": "The lease's end reason (admin, culled, ...)"},
        "by_admin": {"type": "boolean", "title": "A pool admin ended the lease"},
        "message": {"type": "string", "title": "What the tab tells its user"},
    },
    "required": ["reason", "by_admin", "message"],
}
# How long the tabs' sockets get to carry the event before the server goes on stopping.
FLUSH_SECONDS = 0.5
# At most this long is spent asking the pool service why (the container's stop timeout is longer).
ASK_SECONDS = 3.0


def message(reason: str, by_admin: bool) -> str:
    if by_admin:
        return "An admin ended the GPU lease of this server: it is stopping now (unsaved work is lost)."
    if reason == "culled":
        return "This server was idle and is being culled: it is stopping now."
    return f"The GPU lease of this server ended ({reason}): it is stopping now."


class StopNotice(ExtensionApp):
    """The stop hook (jupyter-server calls extension apps' stop_extension; plain extensions have none)."""

    name = "gpuhub_stop_notice"
    load_other_extensions = True

    def initialize_settings(self):
        self.serverapp.event_logger.register_event_schema(SCHEMA)

    async def stop_extension(self):
        status = self.serverapp.web_app.settings.get("gpuhub_lab_status")
        if status is None:
            return
        try:
            data = await asyncio.wait_for(status.status(fresh=True), ASK_SECONDS)
        except (asyncio.TimeoutError, OSError) as exc:
            self.log.warning("gpuhub: could not ask the pool service why this server stops: %s", exc)
            return
        ending = data.get("ending") if data.get("available") else None
        if not ending:
            return  # the user's own stop, or the hub's shutdown: nothing to explain
        reason, by_admin = str(ending.get("reason", "")), bool(ending.get("by_admin"))
        self.log.info("gpuhub: telling the open tabs that this server stops (%s)", reason)
        self.serverapp.event_logger.emit(schema_id=SCHEMA_ID, data={
            "reason": reason, "by_admin": by_admin, "message": message(reason, by_admin)})
        await asyncio.sleep(FLUSH_SECONDS)
