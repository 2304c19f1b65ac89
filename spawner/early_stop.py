"""A hub-managed service's very first lines: SIGINT and SIGTERM end it at once while it starts.

A hub started with SIGINT ignored (a background job of a shell script) passes
that on to the services it starts (JupyterHub installs its own handlers only
after it has started them), and Python then leaves SIGINT ignored.  Without
this, a stop that came during the second or two of a service's imports was
lost, and the hub sent SIGTERM only its `interrupt_timeout` (30 s) later.  This
module imports nothing but `signal`, so the window left is the interpreter's
own start (a tenth of a second).  The service's event loop takes both signals
over once it runs (`loop.add_signal_handler`, poolpage/app.py serve).

The handler ends the process with `os._exit`, not by raising SystemExit: Python
runs a signal handler between any two bytecodes, also inside a weakref callback
or a `__del__`, where it prints an exception as "Exception ignored" and drops it.
A SIGINT that came while importlib ran its module-lock callback was lost that way
(a fresh run's `test_poolpage_stop`), and the hub waited the 30 s.  While the
service starts there is nothing to save: the ledger's writes are transactions
(a stop then is a rollback, as a crash is), and the ledger's threads must not
hold the exit up.
"""

from __future__ import annotations

import os
import signal
import sys


def _leave(signum, _frame):
    sys.stderr.write(f"stopped by signal {signum} while starting\n")
    sys.stderr.flush()
    os._exit(0)


def stop_at_first_signal() -> None:
    """From now until the event loop takes over: SIGINT or SIGTERM ends the process at once (exit 0)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _leave)
