"""A service's first lines (spawner/early_stop.py): a stop while it starts ends it at once, wherever
the signal lands, also where Python drops exceptions (a weakref callback, as importlib's own)."""

from __future__ import annotations

import subprocess
import sys

import pytest

# The SIGINT is delivered while a weakref callback runs: a handler that raised SystemExit there
# had it printed as "Exception ignored" and dropped, and the process went on.
SIGNAL_IN_A_WEAKREF_CALLBACK = """
import os, signal, time, weakref
from spawner.early_stop import stop_at_first_signal

stop_at_first_signal()

class Thing:
    pass

def callback(_ref):
    os.kill(os.getpid(), signal.{sig})
    for _ in range(1000):  # the handler runs at the next bytecodes, still inside this callback
        pass

thing = Thing()
ref = weakref.ref(thing, callback)
del thing
time.sleep(5)
print("still running after the signal", flush=True)
"""


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_inside_a_weakref_callback_still_ends_the_start(sig):
    proc = subprocess.run([sys.executable, "-c", SIGNAL_IN_A_WEAKREF_CALLBACK.format(sig=sig)],
                          capture_output=True, text=True, timeout=30)
    assert "still running" not in proc.stdout, proc.stderr
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "stopped by signal" in proc.stderr, proc.stderr
