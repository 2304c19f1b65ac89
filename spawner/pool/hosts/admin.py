"""What admins do to the ledger, as methods of the GPUPool facade (a mixin).

Drain and undrain, audit records, reconcile against live containers, rehome a
host: validation here, SQL in release.py; the facade supplies the store
(`_write`, `_read`, `_store`), its log and its wake-ups.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from .. import validation
from ..history import queries
from ..leasing import release
from ..ledger.part import PoolPart
from ..models import EndReason, GPUStatus, InvalidRequest, Lease

if TYPE_CHECKING:
    from ..leasing.placement import Topology


class PoolAdministration(PoolPart):
    """GPUPool's admin operations (see the module docstring)."""

    # Supplied by the GPUPool facade besides PoolPart's (declared for the type checker only).
    _topology: Topology
    gpus: Callable[[], list[GPUStatus]]

    def reconcile(self, host: str, live_lease_ids: Iterable[int]) -> list[Lease]:
        """End the active leases of `host` whose ids are not in `live_lease_ids`.

        The hub calls this at start with the lease ids of the containers it
        found running; leases without a container end with reason
        'reconciled'.  Returns the leases ended.
        """
        host = validation.name(host, "The host name")
        try:
            live = {int(i) for i in live_lease_ids}
        except (TypeError, ValueError):
            raise InvalidRequest("live_lease_ids must be lease ids (whole numbers)") from None
        ended = self._write(lambda conn: release.reconcile(self._store, conn, host, live))
        for l in ended:
            self.log.warning(
                "Ended GPU lease %d of %s/%s on %s: no container holds it", l.id, l.user, l.server_name, host
            )
        if ended:
            self._notify()
        return ended

    def record_end_intent(self, lease_id: int, reason: EndReason | str, actor: str) -> bool:
        """Note, before asking the hub to stop a lease's server, who asks and why (`culled`, `admin`).

        The spawner reads it when the stop arrives (`end_intent`): JupyterHub tells a spawner
        nothing of who asked.  False when the lease is not active."""
        reason = EndReason(reason).value
        actor = validation.name(actor, "The actor's name")
        return self._write(lambda conn: release.record_end_intent(self._store, conn, int(lease_id), reason, actor))

    def end_intent(self, lease_id: int, max_age: float = 300.0) -> tuple[str, str] | None:
        """(reason, actor) of the intent recorded for `lease_id` within `max_age` seconds, else None."""
        return self._read(lambda conn: release.end_intent(self._store, conn, int(lease_id), max_age))

    def _set_drained(self, uuid: str, host: str | None, drained: bool, by: str | None) -> GPUStatus:
        uuid = validation.name(uuid, "The GPU uuid")
        host = validation.name(host, "The host name") if host is not None else None
        by = validation.name(by, "The actor's name") if by is not None else None
        gpu_host, gpu_uuid = self._write(
            lambda conn: release.set_drained(self._store, conn, uuid, host, drained, by))
        if not drained:
            self._notify()
        return next(s for s in self.gpus() if s.gpu.host == gpu_host and s.gpu.uuid == gpu_uuid)

    def drain(self, uuid: str, host: str | None = None, by: str | None = None) -> GPUStatus:
        """Stop lending a GPU (for maintenance).  Its current lease, if any, runs on.

        `by` (who asked) is kept in the ledger's audit records (`audit()`).
        """
        status = self._set_drained(uuid, host, True, by)
        self.log.info("Drained GPU %s on %s%s", status.gpu.uuid, status.gpu.host, f" (by {by})" if by else "")
        return status

    def undrain(self, uuid: str, host: str | None = None, by: str | None = None) -> GPUStatus:
        """Lend a drained GPU again."""
        status = self._set_drained(uuid, host, False, by)
        self.log.info("Undrained GPU %s on %s%s", status.gpu.uuid, status.gpu.host, f" (by {by})" if by else "")
        return status

    def record(self, actor: str, action: str, detail: str | None = None, host: str | None = None,
               uuid: str | None = None, detail_limit: int = 2000) -> None:
        """Write an audit record of an admin action taken outside the ledger (ending a lease,
        an action script): who (`actor`), what (`action`, `detail`, its first `detail_limit`
        characters: an action script's record keeps the whole script), when (the ledger's clock)."""
        actor = validation.name(actor, "The actor's name")
        action = validation.name(action, "The action")[:32]
        limit = max(0, int(detail_limit))
        self._write(lambda conn: release.record(self._store, conn, actor, action,
                                              None if detail is None else str(detail)[:limit], host, uuid))

    def audit(self, limit: int = 100) -> list[dict]:
        """The newest admin actions recorded with a `by` (who, what, when), newest first."""
        return self._read(lambda conn: queries.audit(conn, max(1, int(limit))))

    def rehome(self, old_host: str, new_host: str) -> dict[str, int]:
        """Move the ledger's GPUs and active leases of `old_host` to the name `new_host`.

        For a renamed machine (or a hub container recreated under a new host
        name): run it while the hub is stopped.  Returns {"gpus", "leases"} moved.
        """
        old_host = validation.name(old_host, "The old host name")
        new_host = validation.name(new_host, "The new host name")
        if old_host == new_host:
            raise InvalidRequest("The old and new host names are the same")
        moved = self._write(release.rehome, old_host, new_host)
        self.log.warning("Moved %d GPU(s) and %d active lease(s) from host %s to %s",
                         moved["gpus"], moved["leases"], old_host, new_host)
        self._topology.clear()
        return moved
