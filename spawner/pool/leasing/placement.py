"""Placement: which free GPUs a lease gets, from a snapshot of the free GPUs.

Pure decisions over plain data (host -> [(index, uuid)] free) and a distance
function; `Topology` only caches the inventory's distances (NVML calls are slow).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from ...inventory.machine import TOPOLOGY_SYSTEM, Inventory

Free = dict[str, list[tuple[int, str]]]  # host -> [(index, uuid)] free GPUs, by index
Distance = Callable[[str, str, str], int]  # (host, uuid a, uuid b) -> topology level


def host_demand(profiles: Iterable, hosts_matching: Callable[[dict], list[str]]) -> dict[str, int]:
    """GPU host -> how many of the host-tagged GPU `profiles` (objects with `gpus` and
    `node_labels`) can use it, for GPUPool.set_host_demand; `hosts_matching` is the
    inventory's.  Servers and jobs compute it the same way."""
    demand: dict[str, int] = {}
    for profile in profiles:
        if profile.gpus and profile.node_labels:
            for host in hosts_matching(dict(profile.node_labels)):
                demand[host] = demand.get(host, 0) + 1
    return demand


class Topology:
    """Topology distances of GPU pairs, cached, from this host's inventory.

    Another host's topology is unknown here: its GPUs all count as far apart.
    A failing topology query is a missed preference, never an error.
    """

    def __init__(self, inventory: Inventory | None, log):
        self.inventory = inventory
        self.log = log
        self._distance: dict[str, dict[str, dict[str, int]]] = {}
        # host -> how many host-tagged profiles can use it (GPUPool.set_host_demand).
        self.demand: dict[str, int] = {}
        self._neighbours: dict[str, dict[str, tuple[set[str], list[tuple[int, str]]]]] = {}

    def clear(self) -> None:
        self._distance.clear()
        self._neighbours.clear()

    def distance(self, host: str, a: str, b: str) -> int:
        row = self._distance.setdefault(host, {}).setdefault(a, {})
        d = row.get(b)
        if d is None:
            if a == b:
                d = 0
            elif self.inventory is not None and self.inventory.host == host:
                try:
                    d = int(self.inventory.distance(a, b))
                except Exception as e:  # topology is a preference, never a failure
                    self.log.debug("No topology for %s/%s: %s", a, b, e)
                    d = TOPOLOGY_SYSTEM
            else:
                d = TOPOLOGY_SYSTEM
            row[b] = d
            self._distance[host].setdefault(b, {})[a] = d
        return d

    def neighbours(self, host: str, uuid: str, free_set: set[str]) -> list[tuple[int, str]]:
        """Other GPUs of `host`, nearest first (cached; extended as GPUs appear)."""
        cache = self._neighbours.setdefault(host, {})
        entry = cache.get(uuid)
        if entry is None or not free_set <= entry[0]:
            known = (entry[0] if entry else set()) | free_set | {uuid}
            others = sorted((self.distance(host, uuid, o), o) for o in known if o != uuid)
            entry = cache[uuid] = (known, others)
        return entry[1]

    def choose(self, free: Free, hosts: Iterable[str] | None, count: int) -> tuple[str, list[str]] | None:
        return choose(free, hosts, count, self.distance, self.neighbours, self.demand)


def pick_on_host(
    host: str,
    free: list[tuple[int, str]],
    count: int,
    dist: Distance,
    neighbours: Callable[[str, str, set[str]], list[tuple[int, str]]] | None = None,
) -> list[str]:
    """The `count` GPUs of `free` (sorted by index) to lend together."""
    if count == len(free):
        return [u for _, u in free]
    if count == 1:
        # Take the most isolated GPU, keeping close pairs free for
        # multi-GPU requests; ties go to the lowest index.
        free_set = {u for _, u in free}
        best_uuid, best_near = free[0][1], -1
        for _, uuid in free:
            if neighbours is not None:
                near = next(d for d, other in neighbours(host, uuid, free_set) if other in free_set)
            else:
                near = min(dist(host, uuid, o) for o in free_set if o != uuid)
            if near > best_near:
                best_uuid, best_near = uuid, near
        return [best_uuid]
    best = None
    for seed in free:
        chosen = [seed]
        rest = [f for f in free if f is not seed]
        while len(chosen) < count:
            nxt = min(rest, key=lambda f: (sum(dist(host, f[1], c[1]) for c in chosen), f[0]))
            chosen.append(nxt)
            rest.remove(nxt)
        pairs = [dist(host, x[1], y[1]) for i, x in enumerate(chosen) for y in chosen[i + 1 :]]
        score = (max(pairs), sum(pairs), sorted(i for i, _ in chosen))
        if best is None or score < best[0]:
            best = (score, chosen)
    assert best is not None  # `free` holds at least `count` GPUs
    return [u for _, u in sorted(best[1])]


def choose(
    free: Free,
    hosts: Iterable[str] | None,
    count: int,
    dist: Distance,
    neighbours: Callable[[str, str, set[str]], list[tuple[int, str]]] | None = None,
    demand: Mapping[str, int] | None = None,
) -> tuple[str, list[str]] | None:
    """Pick a host and GPUs for `count` from `free`; None if none fits.

    A lease never spans hosts; best fit: the host with the fewest free GPUs
    that still fits, keeping big blocks free for big requests.  Before that,
    the hosts that fewer host-tagged profiles ask for (`demand`: host -> how
    many) come first, so a request that could run anywhere spends the GPUs
    that only some profiles can use last.
    """
    fitting = [h for h in (hosts if hosts is not None else free) if len(free.get(h, ())) >= count]
    if not fitting:
        return None
    asked = demand or {}
    host = min(fitting, key=lambda h: (asked.get(h, 0), len(free[h]), h))
    return host, pick_on_host(host, free[host], count, dist, neighbours)


Pick = tuple[str, list[str]]  # (host, uuids) of one lease


def choose_gang(
    choose: Callable[[Free, Iterable[str] | None, int], Pick | None],
    free: Free,
    hosts: Iterable[str] | None,
    count: int,
    workers: int,
) -> list[Pick] | None:
    """`workers` leases of `count` GPUs each, all placed or none (None): one per worker, in order.

    Fewest hosts first: one host that fits them all (chosen by `choose`, so best fit and
    topology hold as for one lease), else the hosts with the most room, the last one the
    smallest that fits the rest.  Only `hosts` are used (the profile's host tags, or the
    engine's one host, narrow them: a cluster on one Docker host never spans).
    """
    if workers == 1:
        pick = choose(free, hosts, count)
        return None if pick is None else [pick]
    whole = choose(free, hosts, count * workers)
    if whole is not None:
        host, uuids = whole
        return [(host, uuids[i * count:(i + 1) * count]) for i in range(workers)]
    slots = {h: len(free.get(h, ())) // count for h in (hosts if hosts is not None else free)}
    slots = {h: n for h, n in slots.items() if n}
    if sum(slots.values()) < workers:
        return None
    picks: list[Pick] = []
    left = workers
    while left:
        fits = [h for h in slots if slots[h] >= left]
        host = min(fits, key=lambda h: (slots[h], h)) if fits else max(slots, key=lambda h: (slots[h], h))
        n = min(slots.pop(host), left)
        pick = choose(free, [host], n * count)
        assert pick is not None  # the host has n * count free GPUs
        picks += [(host, pick[1][i * count:(i + 1) * count]) for i in range(n)]
        left -= n
    return picks


def gang_fits(capacity: dict[str, int], hosts: Iterable[str] | None, count: int, workers: int) -> bool:
    """Whether `workers` x `count` GPUs could ever be placed on `hosts` of this `capacity` (all free)."""
    return sum(capacity.get(h, 0) // count for h in (hosts if hosts is not None else capacity)) >= workers
