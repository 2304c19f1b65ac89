"""The jobs runner's engine boundary: what it asks of Docker (one host) or Swarm (many).

The runner decides (queue, lease, limits, timeout, cancel, what the ledger says); an engine
only runs *units*, the containers of a job, and reports on them.  A job is a group of units
(group.py): a plain job's one, or a cluster's workers (several units of one job on named
hosts, talking over a network of their own: several `UnitSpec`s with the same job label, each
with its `host` and `aliases`, on a network made by `create_network`).  Engines apply the
lock-down (non-root, no capabilities, no-new-privileges, pids and log bounds) to every unit
themselves: a spec cannot ask it away.

- spawner/engines/common/job_containers.py: `DockerJobEngine`, a unit is a container on the hub's own engine;
- spawner/engines/swarm/job_services.py: `SwarmJobEngine`, a unit is a service (restart none) pinned to its node.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

# A unit's phase, as the runner reads it.  Only ENDED frees its GPUs: UNKNOWN (its node does
# not answer) may still run.
CREATED, RUNNING, ENDED, UNKNOWN = "created", "running", "ended", "unknown"


class UnitGone(Exception):
    """The engine has no such unit (never made, or removed)."""


class JobRefused(Exception):
    """The engine cannot run this job at all (HTTP 409); str() says why and what to do."""


@dataclass(frozen=True)
class UnitSpec:
    """One container of a job, engine-neutral (spec.py builds it; pure data)."""

    name: str  # unique among the engine's units: the container or service name
    image: str
    command: list[str]  # argv, run through the image's entrypoint
    user: str  # "uid:gid", never root
    env: Mapping[str, str]
    labels: Mapping[str, str]  # lease labels (containers.lease_labels) plus LABEL_JOB
    working_dir: str
    volumes: Mapping[str, str]  # volume name -> mount point (the user's home)
    gpus: tuple[str, ...] = ()  # leased uuids; () = no GPU at all
    host: str = ""  # the node it must run on (a Swarm node's hostname); "" = the engine's own host
    network: str | None = None  # a network to join; None = no network
    aliases: tuple[str, ...] = ()  # names the other units of its job reach it by on `network`
    cpu_limit: float | None = None
    mem_limit: str | int | None = None
    shm_size: str = "64m"
    # Seconds its processes get after SIGTERM before they are killed, where the engine fixes it at
    # creation (Swarm: the service's stop grace period); None: the engine's own.  A job on
    # borrowed GPUs gets GPUPool.reclaim_grace: on Swarm its notice is the stop's own SIGTERM.
    stop_grace: float | None = None


@dataclass(frozen=True)
class UnitState:
    """What the engine says of a unit now."""

    name: str
    id: str
    labels: Mapping[str, str] = field(default_factory=dict)
    phase: str = RUNNING  # CREATED, RUNNING, ENDED or UNKNOWN
    exit_code: int | None = None  # once ENDED (None: ended without one, e.g. rejected)
    message: str | None = None  # the engine's words: why it ended, or why its state is unknown
    node: str = ""

    @property
    def holding(self) -> bool:
        """Whether it may still run, and so hold its GPUs."""
        return self.phase != ENDED


class LogStream(Protocol):
    """A follow=True log stream: iterate for bytes; close() ends it (from any thread)."""

    def __iter__(self) -> Iterator[bytes]: ...

    def close(self) -> None: ...


@runtime_checkable
class JobEngine(Protocol):
    """What the jobs runner needs of an engine.  Every method but `open_follow` is a
    coroutine that never blocks the event loop."""

    # Seconds an ended unit's log may take to arrive after it ended (Swarm's come from the
    # node): the runner reads it before the stop too, and again while it reads empty.  0: none.
    log_settle_seconds: float

    async def create(self, spec: UnitSpec) -> None:
        """Create the unit and start it; raises if the engine refuses (nothing left behind)."""

    async def inspect(self, name: str) -> UnitState | None:
        """Its state now; None if there is no such unit.  An engine that cannot tell says UNKNOWN."""

    async def wait(self, name: str, timeout: float) -> UnitState | None:
        """Its state once it has ended, or after `timeout` s, whichever comes first; None if gone."""

    async def stop(self, name: str, grace: float) -> bool:
        """Stop it (SIGTERM, then SIGKILL after `grace` s); True once the engine confirms it
        no longer runs (or does not exist).  It stays, with its log, until `remove`."""

    async def signal(self, name: str, signal: str = "SIGTERM") -> bool:
        """Send its processes `signal` (the notice of a reclaim: save and exit) and leave it
        running; True if delivered, False if the engine cannot (then only `stop` tells it)."""

    async def remove(self, name: str) -> bool:
        """Remove it, running or not; True once done (or already gone)."""

    async def logs(self, name: str, tail: int) -> bytes:
        """Its last `tail` log entries (stdout and stderr); raises UnitGone."""

    def open_follow(self, name: str, timeout: float) -> tuple[object, LogStream]:
        """Blocking (call it on a thread): (a client to close() when done, a follow stream of
        its log), opened within `timeout` s; raises UnitGone."""

    async def units(self, pool_id: str) -> list[UnitState]:
        """Every job unit of ledger `pool_id` on every host the engine reaches, for the
        reconciler; raises if the engine cannot list them all (nothing is then judged)."""

    async def create_network(self, name: str, labels: Mapping[str, str], outbound: bool = False) -> None:
        """A network for the units of one job, on every host the engine may place them, that no
        other container joins; nothing if it exists.  Internal (no route out) unless `outbound`
        (a profile with `job_network`: on one Docker host a route out through the host's NAT and
        the hub's API and the gpu-pool service, under the host's rules, engines/common/firewall.py;
        on Swarm internal all the same, its units going out through a proxy of its own,
        engines/swarm/job_services.py)."""

    async def remove_network(self, name: str) -> bool:
        """True once it is gone (on Swarm, with the proxy of its own that `create_network` made)."""

    async def networks(self, pool_id: str) -> dict[str, str]:
        """Every job network of ledger `pool_id` the engine reaches: name -> the job id it was
        made for (its LABEL_JOB), for the reconciler to remove those whose job has ended."""

    async def lease_hosts(self, node_labels: Mapping[str, str], image: str = "") -> list[str] | None:
        """The hosts whose GPUs a job asking for `node_labels` may lease (None: any the pool
        lends; Docker: its own host), less those that would run `image` without the lock-down."""

    async def prepare_home(self, user: str, image: str, uid: int, gid: int, directory_identity: bool) -> str:
        """The user's home volume, ready for uid:gid on every host (engines/common/homes.py's rules); its name."""

    async def home_dir(self, user: str) -> str | None:
        """The user's home as a directory this process can read (a local volume's), to check a
        notebook's path before the job is queued; None where there is none (no volume yet: ""),
        e.g. on Swarm, whose homes live on other nodes: the job's container checks it then."""


async def wait_until_ended(inspect, name: str, timeout: float, poll: float) -> UnitState | None:
    """`inspect(name)` every `poll` seconds until the unit has ended, is gone (None) or
    `timeout` seconds passed: what every engine's `wait` is, for engines that poll."""
    import asyncio

    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(timeout, 0.0)
    while True:
        state = await inspect(name)
        left = deadline - loop.time()
        if state is None or state.phase == ENDED or left <= 0:
            return state
        await asyncio.sleep(min(poll, left))
