"""What one client may hold in the gpu-pool service, and how long the service waits on others.

`c.PoolServiceLimits` in the hub's config (like `c.GPUPool`); the hub hands the values to the
service in its settings file, written from the final config (service_config.py).
"""

from __future__ import annotations

from traitlets import Float, Int, TraitError, validate
from traitlets.config import Configurable


class PoolServiceLimits(Configurable):
    """Limits of the gpu-pool service (log followers, timeouts on the hub and on Docker)."""

    log_followers_per_job = Int(
        4,
        config=True,
        help="""Most readers following one job's log at once (`GET .../logs?follow=1`).

        Each follower holds a Docker log stream and a thread of the service while it reads.
        One more gets 429 with a message that says so; a reader that goes away frees its place
        at once.
        """,
    )

    log_followers_per_user = Int(
        8,
        config=True,
        help="""Most job logs one user (or token) follows at once, over all jobs.

        One more gets 429 with a message naming this limit.
        """,
    )

    log_followers_total = Int(
        64,
        config=True,
        help="""Most job logs the service follows at once, for everyone together.

        Bounds the threads and Docker streams that log followers can hold.  One more gets 429.
        """,
    )

    log_buffer_chunks = Int(
        64,
        config=True,
        help="""Docker log frames (each at most 16 KiB) kept for one follower that reads slowly.

        When they are full the service stops reading the container's log for that follower
        until the follower catches up: a stalled reader costs at most this much memory.
        """,
    )

    log_stall_timeout = Float(
        60.0,
        config=True,
        help="""Seconds a follower may go without taking any of its log before it is dropped.

        A client that stops reading (and keeps its connection open) would otherwise hold its
        Docker stream, its thread and its place among the followers for as long as the job runs.
        """,
    )

    hub_auth_timeout = Float(
        10.0,
        config=True,
        help="""Seconds the service waits for the hub to say who a token or cookie belongs to.

        Checked off the event loop; a hub that does not answer in time gets the request a 503
        ("the hub did not confirm who you are"), and every other request keeps being served.
        """,
    )

    docker_timeout = Float(
        10.0,
        config=True,
        help="""Seconds the service waits for Docker to open a connection or a log stream.

        A Docker daemon that does not answer gets the request a 503; the service's event loop
        never waits on it.
        """,
    )

    occupancy_max_days = Int(
        366,
        config=True,
        help="""Longest period, in days from `since` to `until`, that `api/occupancy` (and its CSV,
        and the page's usage charts) covers.

        A chart reads the ledger's hours and intervals over its whole period: a longer one is
        refused with 400 naming this limit, so no request reads the ledger's whole history.
        GPU-hours over any period stay in `api/usage` and `gpu-pool history`.
        """,
    )

    @validate("log_followers_per_job", "log_followers_per_user", "log_followers_total", "log_buffer_chunks",
              "occupancy_max_days")
    def _check_count(self, proposal):
        if proposal.value < 1:
            raise TraitError(f"PoolServiceLimits.{proposal.trait.name} must be >= 1")
        return proposal.value

    @validate("log_stall_timeout", "hub_auth_timeout", "docker_timeout")
    def _check_seconds(self, proposal):
        if not proposal.value > 0:
            raise TraitError(f"PoolServiceLimits.{proposal.trait.name} must be > 0")
        return proposal.value
