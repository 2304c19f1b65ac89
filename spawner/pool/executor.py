"""The ledger's own threads: every blocking ledger call made from an event loop runs here.

Not the loop's default executor, which JupyterHub and the pool page use for
other work (a long fan-out there must not delay a lease, nor a stuck ledger
call the page).  Bounded: a ledger that stops answering ties up these threads,
never more, and the store's own timeouts end each call.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

LEDGER_THREADS = 8
LEDGER_EXECUTOR = ThreadPoolExecutor(max_workers=LEDGER_THREADS, thread_name_prefix="gpu-ledger")
