"""Recording a host's inventory in the ledger: new GPUs, changed ones, gone ones.

Data flows one way, inventory -> pool: the pool reads the inventory's GPUs and
writes their rows; drain flags and leases survive a sync.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import insert, select, update

from ..inventory import GPU
from .schema import NAME_MAX, gpus_table


def sync(conn, host: str, units: list[GPU], now: datetime, log) -> None:
    """Record `units`, the GPUs of inventory host `host`; mark the host's others missing.

    GPUs of the host that the inventory no longer lists are not lent again
    (their active leases stay until they end).
    """
    hosts = {host} | {g.host for g in units}
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
