"""The GPUs of every node of a Docker Swarm, read from the Swarm manager.

Each GPU node lists its GPUs once, in its dockerd's `node-generic-resources`
(`GPU=GPU-<uuid>`), and carries node labels for the kind (`gpu.model`,
`gpu.memory`, `gpu.cuda`): the pool learns them from `docker node ls` on the
manager, so the admin types nothing twice.  Only nodes that are `ready` and
`active` lend: a node that is down, drained or paused, or that left, is
listed as a host whose GPUs are missing, so the ledger lends none of them; a
node back from down lends a GPU only once the task it was told to stop on it
meanwhile has stopped.
Live utilisation and memory in use (and a node's driver CUDA version without a `gpu.cuda`
label) come from the per-node agent's readings in the ledger (spawner/cli/agent.py).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable

from traitlets import Dict, Float, TraitError, Unicode, validate

from .machine import GPU, Inventory, InventoryError, parse_cuda_version

GENERIC_KIND = "GPU"
LABEL_MODEL = "gpu.model"
LABEL_MEMORY = "gpu.memory"
LABEL_CUDA = "gpu.cuda"


def memory_mib(text: str | None) -> int:
    """'80g', '16G', '40960m', '24GiB' -> MiB; 0 when missing or unreadable."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([gGmMtT])?(?:i?[bB])?\s*", text or "")
    if not m:
        return 0
    scale = {"t": 1024 * 1024, "g": 1024, "m": 1, None: 1}[(m.group(2) or "").lower() or None]
    return int(float(m.group(1)) * scale)


def node_gpus(node: dict) -> list[str]:
    """The GPU uuids a node advertises as Swarm generic resources."""
    resources = ((node.get("Description") or {}).get("Resources") or {}).get("GenericResources") or []
    uuids = []
    for entry in resources:
        named = entry.get("NamedResourceSpec") or {}
        if named.get("Kind") == GENERIC_KIND and named.get("Value"):
            uuids.append(named["Value"])
    return sorted(set(uuids))


def node_lends(node: dict) -> bool:
    """A node lends its GPUs only while it is ready and active (not drained, paused or down)."""
    return ((node.get("Status") or {}).get("State") == "ready"
            and (node.get("Spec") or {}).get("Availability") == "active")


class SwarmInventory(Inventory):
    """The GPUs of all the Swarm's nodes (see the module docstring)."""

    # The pool lends from any host this inventory lists, not only `host`.
    multi_host = True

    docker_url = Unicode(
        "",
        config=True,
        help="Docker API of a Swarm manager (e.g. unix:///var/run/docker.sock).  Empty: the "
        "environment's (DOCKER_HOST, else the local socket), as the spawner uses.",
    )
    cache_seconds = Float(
        2.0,
        config=True,
        help="How long one reading of the Swarm's nodes is reused.  Node changes (join, leave, "
        "down, drain) reach the ledger at the next GPU spawn or reconcile pass after this.",
    )

    lending_node_labels = Dict(
        value_trait=Unicode(),
        config=True,
        help="Lend only from the Swarm nodes whose labels include every one of these "
        "(`{\"gpuhub.pool\": \"lab\"}`): a Swarm whose other nodes serve other workloads, or "
        "another hub.  Nodes without them are not in the pool at all (no lease, no server, no job "
        "lands there).  Empty: every node with GPUs.  Set by `GPUHUB_SWARM_NODE_LABELS` "
        "(`key=value,key=value`).",
    )

    reading_max_age = Float(
        60.0,
        config=True,
        help="Seconds a GPU reading of the per-node agent (`gpu-pool agent`) counts as live.  An "
        "older or missing reading means unknown utilisation: the culler's GPU-idle rule never fires "
        "on it.  Keep it a few times the agents' `--interval`.",
    )

    @validate("reading_max_age")
    def _check_reading_max_age(self, proposal):
        if not proposal.value > 0:
            raise TraitError("SwarmInventory.reading_max_age must be > 0")
        return proposal.value

    def __init__(self, client=None, **kwargs):
        super().__init__(**kwargs)
        self._readings: Callable[..., dict] | None = None
        self._client = client
        self._lock = threading.Lock()
        self._cached: tuple[float, list[dict]] | None = None
        self._seen_hosts: set[str] = set()

    def _docker(self):
        if self._client is None:
            import docker

            self._client = docker.DockerClient(base_url=self.docker_url) if self.docker_url else docker.from_env()
        return self._client

    def nodes(self) -> list[dict]:
        """The Swarm's nodes as the manager reports them (cached for `cache_seconds`)."""
        with self._lock:
            if self._cached and time.monotonic() - self._cached[0] < self.cache_seconds:
                return self._cached[1]
            try:
                nodes = self._docker().api.nodes()
            except Exception as exc:
                raise InventoryError(f"cannot list the Swarm's nodes (is this a Swarm manager?): {exc}") from None
            wanted = self.lending_node_labels
            nodes = [n for n in nodes
                     if all(((n.get("Spec") or {}).get("Labels") or {}).get(k) == v for k, v in wanted.items())]
            self._cached = (time.monotonic(), nodes)
            return nodes

    def forget_cache(self) -> None:
        with self._lock:
            self._cached = None

    def node_labels(self) -> dict[str, dict[str, str]]:
        """hostname -> the node's labels, for every node with GPUs."""
        return {(n.get("Description") or {}).get("Hostname", ""): dict((n.get("Spec") or {}).get("Labels") or {})
                for n in self.nodes() if node_gpus(n)}

    def hosts(self) -> set[str]:
        """Every host whose GPUs this inventory speaks for (lending or not), also nodes that left."""
        for node in self.nodes():
            if node_gpus(node):
                self._seen_hosts.add((node.get("Description") or {}).get("Hostname", ""))
        return set(self._seen_hosts)

    def gpus(self) -> list[GPU]:
        units: list[GPU] = []
        names: dict[str, int] = {}
        nodes = [n for n in self.nodes() if node_gpus(n)]
        withheld = self.withheld()
        for node in nodes:
            host = (node.get("Description") or {}).get("Hostname", "")
            names[host] = names.get(host, 0) + 1
        for node in nodes:
            host = (node.get("Description") or {}).get("Hostname", "")
            if names[host] > 1:
                self.log.error("Two Swarm nodes are named %s: their GPUs are not lent until one is renamed", host)
                continue
            if not node_lends(node):
                continue
            held = withheld.get(host, set())
            labels = (node.get("Spec") or {}).get("Labels") or {}
            model = labels.get(LABEL_MODEL, "GPU")
            mib = memory_mib(labels.get(LABEL_MEMORY))
            for index, uuid in enumerate(node_gpus(node)):
                if uuid in held:
                    continue  # a task told to stop may still run on it (a node back from down)
                units.append(GPU(host, uuid, index, model, mib))
        self.hosts()
        return sorted(units, key=lambda g: (g.host, g.index))

    def withheld(self) -> dict[str, set[str]]:
        """hostname -> GPU uuids of tasks that were told to stop but whose node has not reported
        them stopped (engines/swarm/tasks.py: withheld_gpus): not lent until it has."""
        # The one arrow from the inventory up to an engine (tests/harness/layers.py): which GPUs
        # a task may still hold is the Swarm engine's knowledge (its tasks' labels and states),
        # and the inventory must never offer one of them (the lease invariant).  Handing it in
        # instead would let a process that forgot to lend a withheld GPU.
        from ..engines.swarm.tasks import node_states, withheld_gpus

        api = self._docker().api
        try:
            tasks = api.tasks()
            states = node_states(api)
        except Exception as exc:
            raise InventoryError(f"cannot list the Swarm's tasks: {exc}") from None
        hostnames = {n["ID"]: (n.get("Description") or {}).get("Hostname", "") for n in self.nodes()}
        by_node: dict[str, list[dict]] = {}
        for task in tasks:
            by_node.setdefault(hostnames.get(task.get("NodeID", ""), ""), []).append(task)
        return {host: withheld_gpus(ts, states) for host, ts in by_node.items() if host}

    def hosts_matching(self, wanted: dict[str, str]) -> list[str]:
        """GPU hosts whose node labels include every `wanted` key=value (all of them when empty)."""
        return sorted(host for host, labels in self.node_labels().items()
                      if all(labels.get(k) == v for k, v in wanted.items()))

    def use_readings(self, readings: Callable[..., dict]) -> None:
        """Read the agents' readings through `readings(max_age, host=None)` -> {(host, uuid): Reading}
        (the pool's `gpu_readings`; the pool hands it over, so this module needs no database)."""
        self._readings = readings

    def _fresh(self, host: str | None = None) -> dict:
        if self._readings is None:
            return {}
        try:
            return self._readings(self.reading_max_age, host=host)
        except Exception as exc:  # ledger down: unknown, never a reason to cull
            self.log.warning("Cannot read the GPU agents' readings: %s", exc)
            return {}

    def reading(self, uuid: str, host: str | None = None):
        """The newest live reading (pool/gpu_readings.Reading) of GPU `uuid` (on `host`), or None."""
        found = [r for (h, u), r in self._fresh(host).items() if u == uuid and (host is None or h == host)]
        return min(found, key=lambda r: r.age_s) if found else None

    def utilization(self, uuid: str, host: str | None = None) -> float | None:
        """The newest live reading of GPU `uuid` (on `host`), or None when stale, missing or unknown."""
        found = self.reading(uuid, host)
        return found.utilization if found else None

    def memory_used_mib(self, uuid: str, host: str | None = None) -> int | None:
        """GPU `uuid`'s memory in use by the newest live reading, or None when stale, missing or unknown."""
        found = self.reading(uuid, host)
        return found.memory_used_mib if found else None

    def cuda_driver_version(self, host: str | None = None) -> tuple[int, int] | None:
        """The lowest driver CUDA version over the GPU nodes (or of `host`): what every node can run.

        A node's `gpu.cuda` label wins; without one, its agent's live reading counts."""
        labelled = {h: parse_cuda_version(labels.get(LABEL_CUDA, "")) for h, labels in self.node_labels().items()
                    if host is None or h == host}
        unlabelled = {h for h, v in labelled.items() if v is None}
        if unlabelled:
            for (h, _uuid), reading in self._fresh(host).items():
                if h in unlabelled and reading.cuda_version:
                    labelled[h] = min(filter(None, (labelled[h], parse_cuda_version(reading.cuda_version))))
        versions = [v for v in labelled.values() if v is not None]
        return min(versions) if versions else None
