"""The jobs a runner is stopping, and why: its owner's cancel, or the pool's fair-use check.

A job marked here is stopped by its own watch at its next turn (runner.py), or leaves the queue
if it waits for GPUs.  What the runner records then comes from here: the job's message
(`cancelled while running`, or the fair-use stop's words) and its leases' end reason
(`job-cancelled`, or `booking` / `budget`, pool/fair_use/stops.py).
"""

from __future__ import annotations

from ..pool.ledger.job_records import CANCELLED, END_REASONS
from ..pool.models import EndReason

OWNER_CANCEL = "cancelled while running"


class Stops:
    """job id -> (the message its stop records, its leases' end reason: None for the state's own)."""

    def __init__(self) -> None:
        self._why: dict[int, tuple[str, EndReason | None]] = {}

    def ask(self, job_id: int, message: str = OWNER_CANCEL, reason: EndReason | None = None) -> None:
        """Stop the job; a job already being stopped keeps its first reason."""
        self._why.setdefault(job_id, (message, reason))

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._why

    def message(self, job_id: int) -> str:
        return self._why.get(job_id, (OWNER_CANCEL, None))[0]

    def end_reason(self, job_id: int, state: str) -> EndReason:
        """What the job's leases end with: the state's, or the fair-use stop's when that stopped it."""
        found = self._why.get(job_id)
        return found[1] if found is not None and found[1] is not None and state == CANCELLED else END_REASONS[state]

    def forget(self, job_id: int) -> None:
        """Once the job's end is recorded (or its watch is over)."""
        self._why.pop(job_id, None)
