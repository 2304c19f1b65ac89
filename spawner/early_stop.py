"""A hub-managed service's very first lines: SIGINT and SIGTERM end it at once while it starts.

A hub started with SIGINT ignored (a background job of a shell script) passes
that on to the services it starts (JupyterHub installs its own handlers only
after it has started them), and Python then leaves SIGINT ignored.  Without
this, a stop that came during the second or two of a service's imports was
lost, and the hub sent SIGTERM only its `interrupt_timeout` (30 s) later.  This
module imports nothing but `signal`, so the window left is the interpreter's
own start (a tenth of a second).  The service's event loop takes both signals
over once it runs (`loop.add_signal_handler`, poolpage/app.py serve).
"""

from __future__ import annotations

import signal


def _leave(_signum, _frame):
    raise SystemExit(0)


def stop_at_first_signal() -> None:
    """From now until the event loop takes over: SIGINT or SIGTERM exits (SystemExit, no traceback)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _leave)
