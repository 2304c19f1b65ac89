"""The test Swarm's owner labels (devservices/swarm.py): what was made by a process that no longer
runs is abandoned, and a pid that was reused by another process since does not keep it."""

from __future__ import annotations

import os
import subprocess
import sys

from devservices.swarm import owner_alive, process_start, this_owner


def test_the_running_process_owns_what_it_made():
    assert owner_alive(this_owner())
    assert this_owner().startswith(f"{os.getpid()}:")


def test_a_process_that_ended_owns_nothing():
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                           text=True, check=True)
    pid = int(ended.stdout)
    assert process_start(pid) == "" or pid == os.getpid()
    assert not owner_alive(f"{pid}:12345")


def test_a_reused_pid_with_another_start_time_owns_nothing():
    pid, _, start = this_owner().partition(":")
    assert not owner_alive(f"{pid}:{int(start) + 1}")


def test_a_label_that_names_no_process_owns_nothing():
    for label in ("", "abc", "123", ":", "123:", "-1:5"):
        assert not owner_alive(label), label
