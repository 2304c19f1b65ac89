"""A queued server's grant is told once the server is ready: the senders ask the hub.

The ledger writes `granted` when the queue hands the GPUs over; the server then still starts
(its container, JupyterLab, the hub's check that it answers).  A mail then would open a spawn
page; so the senders hold a `granted` event until the hub's model of that server says `ready`
(the event's lease is the server's: a later spawn of the same name is not told by an old grant),
and drop it when the server is gone (its start failed, or its user stopped it first).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from ..pool.ledger.events import GRANTED
from ..pool.ledger.outbox import Entry
from ..services.hub_api import HubUnavailable

READY, WAITING, GONE, UNKNOWN = "ready", "waiting", "gone", "unknown"


async def look(hub, user: str, entries: list[Entry], public_base: str) -> dict[int, tuple[str, Entry]]:
    """For each `granted` entry of `user`: (READY with the server's link in its payload's
    `server_url`, WAITING, GONE, or UNKNOWN when the hub did not answer)."""
    granted = [e for e in entries if e.event == GRANTED]
    if not granted:
        return {}
    try:
        servers = {s.name: s for s in await hub.servers_of_user(user)}
    except HubUnavailable:
        return {e.id: (UNKNOWN, e) for e in granted}
    origin = "{0.scheme}://{0.netloc}".format(urlsplit(public_base))
    out: dict[int, tuple[str, Entry]] = {}
    for e in granted:
        srv = servers.get(e.payload.get("server_name") or "")
        lease = e.payload.get("lease_id")
        if srv is None or (srv.ready and lease is not None and srv.lease_id != lease):
            out[e.id] = (GONE, e)
        elif not srv.ready:
            out[e.id] = (WAITING, e)
        else:
            out[e.id] = (READY, e._replace(payload={**e.payload, "server_url": origin + (srv.url or "/")}))
    return out
