"""GPU-hour budgets reaching 80 % and 100 %: the gpu-pool service's watch over the users' budgets.

Every `Notifications.cull_check_every` seconds, when the lending hub published budgets
(`GPUPool.gpu_hour_budget`, `group_gpu_hour_budgets`: fair_use/budget.py), the watch reads the
standing of each budget of every user who holds GPUs now (a budget grows only while GPUs are
held) and writes a `budget` event for each one at THRESHOLDS or over, once per budget and
threshold in a budget period (events.budget_reached).  At 100 % the culler ends the user's GPU
servers and jobs (reason `budget`); the news says so, and when the next GPU-hour frees.
"""

from __future__ import annotations

import json

from ..pool.fair_use import budget
from ..pool.ledger import events
from ..pool.ledger.store import as_utc

THRESHOLDS = (80, 100)  # percent of a budget's GPU-hours


def look(store, conn, now=None) -> list[tuple[str, str, int, float, dict]]:
    """(user, who, percent, period_s, payload) of every budget at a threshold or over, for the
    users holding GPUs now (in one transaction)."""
    budgets = budget.published(conn)
    if not budgets.any:
        return []
    now = now or store.now(conn)
    holders: dict[str, set[str]] = {}
    for _, user, groups, _, _ in store.rows(conn, budget.ACTIVE):
        holders.setdefault(user, set()).update(json.loads(groups))
    out = []
    for user, groups in sorted(holders.items()):
        for s in budget.standings(store, conn, user, groups, budgets, now):
            if s.limit <= 0:
                continue
            reached = [p for p in THRESHOLDS if s.exhausted or s.used >= s.limit * p / 100]
            if not reached:
                continue
            payload = {"used": round(s.used, 3), "limit": s.limit, "message": s.message(budgets.period_s),
                       "frees_at": as_utc(s.frees_at).isoformat() if s.frees_at else None,
                       "runs_out_at": as_utc(s.runs_out_at).isoformat() if s.runs_out_at else None}
            out.append((user, s.who, max(reached), budgets.period_s, payload))
    return out


def run_once(store) -> int:
    """One look (a read, leaving out what was told this period; a write only when news is left);
    the number of events queued (blocking: call it on the ledger's threads)."""
    found = store.read(lambda conn: [f for f in look(store, conn) if not events.budget_told(store, conn, *f[:4])])
    if not found:
        return 0
    return store.write(lambda conn: sum(events.budget_reached(store, conn, user, who, percent, period_s, payload)
                                        for user, who, percent, period_s, payload in found))
