"""Recording a host's inventory in the ledger: new GPUs, changed ones, gone ones.

Data flows one way, inventory -> pool: the pool reads the inventory's GPUs and
writes their rows; drain flags and leases survive a sync.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import insert, select, update

from ...inventory.machine import GPU
from ..ledger.schema import NAME_MAX, gpus_table, lease_gpus_table
from ..models import HostConflict


def sync(conn, host: str | set[str], units: list[GPU], now: datetime, log) -> None:
    """Record `units`, the GPUs of inventory host `host` (or hosts); mark the hosts' others missing.

    GPUs of the host that the inventory no longer lists are not lent again
    (their active leases stay until they end).  Refuses (HostConflict) when
    the ledger holds one of these GPUs under another host name.
    """
    check_host_identity(conn, units)
    hosts = ({host} if isinstance(host, str) else set(host)) | {g.host for g in units}
    existing = {
        (r.host, r.uuid)
        for r in conn.execute(select(gpus_table.c.host, gpus_table.c.uuid).where(gpus_table.c.host.in_(hosts)))
    }
    for g in units:
        values = dict(
            idx=g.index,
            name=g.name[:NAME_MAX],
            memory_mib=g.memory_mib,
            parent_uuid=g.parent_uuid,
            pci_bus_id=g.pci_bus_id,
            present=True,
            seen_at=now,
        )
        if (g.host, g.uuid) in existing:
            conn.execute(
                update(gpus_table).where(gpus_table.c.host == g.host, gpus_table.c.uuid == g.uuid).values(**values)
            )
        else:
            conn.execute(insert(gpus_table).values(host=g.host, uuid=g.uuid, drained=False, **values))
    gone = existing - {(g.host, g.uuid) for g in units}
    for gone_host, uuid in gone:
        log.warning("GPU %s on %s is gone from the inventory; it will not be lent", uuid, gone_host)
        conn.execute(
            update(gpus_table).where(gpus_table.c.host == gone_host, gpus_table.c.uuid == uuid).values(present=False)
        )


def check_host_identity(conn, units: list[GPU]) -> None:
    """Refuse GPUs the ledger already lends or lists as present under another host name.

    A GPU's uuid is unique in the world, so the same uuid under two host
    names is one GPU known by two names: a renamed machine, a hub container
    recreated with a new host name.  Lending it under both would hand it to
    two users.  Rows the other name marked missing, with no active lease,
    are history and do not conflict.
    """
    by_uuid = {g.uuid: g.host for g in units}
    if not by_uuid:
        return
    g, lg = gpus_table, lease_gpus_table
    active = select(lg.c.uuid).where(lg.c.host == g.c.host, lg.c.uuid == g.c.uuid, lg.c.ended_at.is_(None))
    rows = conn.execute(
        select(g.c.host, g.c.uuid).where(
            g.c.uuid.in_(list(by_uuid)), g.c.present.is_(True) | active.exists()
        )
    ).all()
    clashes = sorted((r.host, r.uuid) for r in rows if r.host != by_uuid[r.uuid])
    if not clashes:
        return
    old = clashes[0][0]
    new = by_uuid[clashes[0][1]]
    more = f" and {len(clashes) - 1} more" if len(clashes) > 1 else ""
    raise HostConflict(
        f"GPU {clashes[0][1]}{more} of this host is in the GPU ledger under host name '{old}', but this hub "
        f"calls its host '{new}' (c.Inventory.host; by default the machine's host name). Lending it under "
        f"both names could give one GPU to two users, so the pool refuses to start. If this machine was "
        f"renamed or the hub's container recreated, either set c.Inventory.host = '{old}' "
        f"(or GPUHUB_GPU_HOST={old}), or stop the hub and move the ledger's records to the new name: "
        f"gpu-pool rehome '{old}' '{new}'"
    )
