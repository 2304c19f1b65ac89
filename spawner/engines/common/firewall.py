"""The host's rules that keep users' containers apart (one Docker host, `gpu-docker`).

Docker's own rules let every container on a bridge reach every other one there and every
address of the host.  The hub makes its bridge with `enable_icc=false` (its containers cannot
reach each other) and installs, with `iptables` (the one Docker uses, legacy or nf_tables),
rules of its own in two chains:

- `GPUHUB-INPUT`, jumped to first from `INPUT` (what the host itself answers): from the hub's
  bridge, and from the bridge of a cluster that may go out (`job_network`), only replies to
  the host's own connections and new connections to the hub's API port and the gpu-pool
  service's port on the bridge's gateway (plus the proxy's public port, and
  `HostFirewall.allowed_ports`); every other host port, on any of its addresses, is refused.
  From a cluster's internal bridge: nothing at all.
- `GPUHUB-FORWARD`, jumped to first from `DOCKER-USER` (what the host routes): from those
  bridges nothing to the link-local range (169.254.169.254, the cloud metadata service),
  nothing between two containers of the hub's bridge (the same rule as `enable_icc=false`,
  for a bridge made before it), and, with `HostFirewall.outbound` false, nothing out at all.

Job clusters' bridges are named by their kind (`gpuhub-i...` internal, `gpuhub-o...` with a
route out), so one wildcard rule covers every cluster the gpu-pool service makes later.
The hub only adds rules, each once (`iptables -C` first), at every start: several hubs on one
host (the tests) each add their own ports; `withdraw` takes a hub's away when it is gone for
good (the tests' cleanup).  `gpu-pool doctor` checks them (`missing`).
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import subprocess
from collections.abc import Iterable, Sequence

from traitlets import Bool, List, TraitError, default, validate
from traitlets import Int as IntTrait
from traitlets.config import Configurable

log = logging.getLogger("gpu-pool.firewall")

INPUT_CHAIN = "GPUHUB-INPUT"
FORWARD_CHAIN = "GPUHUB-FORWARD"
# Interface names of job clusters' bridges (Linux allows 15 characters): the kind's prefix and
# 7 hex digits of the network's name.
INTERNAL_PREFIX = "gpuhub-i"
OUTBOUND_PREFIX = "gpuhub-o"
# Docker's option for a bridge network's interface name, and for keeping its containers apart.
BRIDGE_NAME_OPTION = "com.docker.network.bridge.name"
ICC_OPTION = "com.docker.network.bridge.enable_icc"
LINK_LOCAL = "169.254.0.0/16"
REJECT = ["-j", "REJECT", "--reject-with", "icmp-admin-prohibited"]


class FirewallError(RuntimeError):
    """The rules could not be read or installed; str() says why and what to do."""


class HostFirewall(Configurable):
    """What the hub allows its users' containers on this host (see the module docstring)."""

    enabled = Bool(True, config=True, help="""
        Install the host's rules that keep users' containers apart (one Docker host): from
        the hub's bridge only the hub's API, the gpu-pool service and the proxy's public port
        on this host, no other container of the bridge, no 169.254.0.0/16 (cloud metadata).
        The hub must run as root for it (it calls iptables).  False: the hub installs nothing
        and the containers reach every port of this host and each other's; only for a host
        whose own firewall does the same (docs/how-it-works/security.md lists the rules).
        """)
    outbound = Bool(True, config=True, help="""
        Whether users' servers (and jobs whose profile has `job_network`) may open connections
        to the world outside this host (a package mirror, the internet), through Docker's NAT.
        False: they reach only the hub, the gpu-pool service and the proxy.
        """)
    allowed_ports = List(IntTrait(), config=True, help="""
        More TCP ports of this host that users' containers may reach on the bridge's gateway
        address (a package mirror or proxy the admin runs on the host), besides the hub's
        API port, the gpu-pool service's port and the proxy's public port.
        """)

    @default("allowed_ports")
    def _no_more_ports(self) -> list[int]:
        return []

    @validate("allowed_ports")
    def _ports_are_ports(self, proposal) -> list[int]:
        bad = [p for p in proposal["value"] if not 1 <= p <= 65535]
        if bad:
            raise TraitError(f"c.HostFirewall.allowed_ports: {bad} are not TCP ports (1 to 65535)")
        return proposal["value"]


def job_bridge_name(network: str, outbound: bool) -> str:
    """The interface name of a job cluster's bridge `network` (15 characters at most)."""
    digest = hashlib.sha256(network.encode()).hexdigest()[:7]
    return f"{OUTBOUND_PREFIX if outbound else INTERNAL_PREFIX}{digest}"


def bridge_of(network_attrs: dict) -> str:
    """The host interface of a Docker bridge network (docker network inspect)."""
    named = ((network_attrs.get("Options") or {}).get(BRIDGE_NAME_OPTION) or "").strip()
    return named or f"br-{network_attrs['Id'][:12]}"


def icc_disabled(network_attrs: dict) -> bool:
    return str((network_attrs.get("Options") or {}).get(ICC_OPTION, "true")).lower() == "false"


def rules(bridge: str, gateway: str, ports: Iterable[int], outbound: bool = True) -> list[tuple[str, list[str]]]:
    """(chain, rule) pairs for the hub's bridge `bridge` with its `gateway` address, the host
    ports its containers may reach there (`ports`), and the cluster bridges' wildcards.  Pure.
    The order within a chain matters: the openings first, the refusals last."""
    wanted = sorted({int(p) for p in ports})
    out: list[tuple[str, list[str]]] = []
    for iface in (bridge, OUTBOUND_PREFIX + "+"):
        out.append((INPUT_CHAIN, ["-i", iface, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED",
                                  "-j", "RETURN"]))
        for port in wanted:
            out.append((INPUT_CHAIN, ["-i", iface, "-d", gateway, "-p", "tcp", "--dport", str(port),
                                      "-j", "RETURN"]))
    for iface in (bridge, OUTBOUND_PREFIX + "+", INTERNAL_PREFIX + "+"):
        out.append((INPUT_CHAIN, ["-i", iface, *REJECT]))
    for iface in (bridge, OUTBOUND_PREFIX + "+", INTERNAL_PREFIX + "+"):
        out.append((FORWARD_CHAIN, ["-i", iface, "-d", LINK_LOCAL, *REJECT]))
    out.append((FORWARD_CHAIN, ["-i", bridge, "-o", bridge, *REJECT]))
    if not outbound:
        for iface in (bridge, OUTBOUND_PREFIX + "+"):
            out.append((FORWARD_CHAIN, ["-i", iface, *REJECT]))
    return out


JUMPS = (("INPUT", INPUT_CHAIN), ("DOCKER-USER", FORWARD_CHAIN))


def _iptables() -> str:
    found = shutil.which("iptables") or next(
        (p for p in ("/usr/sbin/iptables", "/sbin/iptables") if shutil.which(p)), None)
    if found is None:
        raise FirewallError("iptables is not installed on this host (Docker's own rules need it too)")
    return found


def _run(args: Sequence[str]) -> subprocess.CompletedProcess:
    return subprocess.run([_iptables(), "-w", *args], capture_output=True, text=True, timeout=30)


def _present(chain: str, rule: Sequence[str]) -> bool:
    return _run(["-C", chain, *rule]).returncode == 0


def _chain_exists(chain: str) -> bool:
    return _run(["-S", chain]).returncode == 0


def _must(args: Sequence[str]) -> None:
    done = _run(args)
    if done.returncode != 0:
        raise FirewallError(f"iptables {' '.join(args)} failed: {(done.stderr or done.stdout).strip()} "
                            "(the hub installs these rules as root; see c.HostFirewall.enabled)")


def install(wanted: list[tuple[str, list[str]]]) -> int:
    """Add every rule of `wanted` that is missing, each chain jumped to first; the number added.
    An opening goes before the chain's refusals (inserted at the top), a refusal at the end."""
    if not _chain_exists("DOCKER-USER"):
        raise FirewallError("the DOCKER-USER chain is missing: is dockerd running with its iptables rules on?")
    added = 0
    for parent, chain in JUMPS:
        if not _chain_exists(chain):
            _must(["-N", chain])
        if not _present(parent, ["-j", chain]):
            _must(["-I", parent, "1", "-j", chain])
            added += 1
    for chain, rule in wanted:
        if _present(chain, rule):
            continue
        opening = rule[-1] == "RETURN"
        _must(["-I", chain, "1", *rule] if opening else ["-A", chain, *rule])
        added += 1
    return added


def missing(wanted: list[tuple[str, list[str]]]) -> list[str]:
    """The rules of `wanted` (and the jumps to them) not in place, as `iptables -A` lines."""
    gone = [f"-A {parent} -j {chain}" for parent, chain in JUMPS if not _present(parent, ["-j", chain])]
    gone += [f"-A {chain} {' '.join(rule)}" for chain, rule in wanted if not _present(chain, rule)]
    return gone


def readable() -> str | None:
    """None when iptables can be read here, else why not."""
    try:
        done = _run(["-S", "INPUT"])
    except FirewallError as exc:
        return str(exc)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"iptables could not run: {exc}"
    return None if done.returncode == 0 else (done.stderr or done.stdout).strip() or "iptables -S failed"


def hub_ports(hub_port: int, pool_page_port: int | None, public_port: int | None,
              more: Iterable[int] = ()) -> list[int]:
    """The host ports users' containers may reach on the gateway."""
    return sorted({p for p in (hub_port, pool_page_port, public_port, *more) if p})


def config_ports(config) -> list[int]:
    """hub_ports() as a hub config (traitlets) says them: the hub's port, the gpu-pool service's
    (its `url`), the proxy's public port (`bind_url`)."""
    from urllib.parse import urlparse

    from jupyterhub.app import JupyterHub

    hub = config.JupyterHub
    hub_port = int(hub.get("hub_port", JupyterHub.hub_port.default_value))
    service = next((s for s in (hub.get("services", None) or []) if s.get("name") == "gpu-pool"), None)
    pool = urlparse(service["url"]).port if service and service.get("url") else None
    bound = urlparse(str(hub.get("bind_url", "http://:8000")))
    public = bound.port or (443 if bound.scheme == "https" else 80)
    return hub_ports(hub_port, pool, public)


def install_for_network(network_attrs: dict, ports: Iterable[int], outbound: bool) -> int:
    """install() for the hub's bridge as Docker describes it; the number of rules added."""
    gateway = network_attrs["IPAM"]["Config"][0]["Gateway"]
    return install(rules(bridge_of(network_attrs), gateway, ports, outbound))


def install_when_the_hub_starts(network: str, ports: list[int]) -> None:
    """Install the rules for the hub's bridge `network` once its config is loaded (the next turn
    of the hub's loop: c.HostFirewall may be set by a file loaded after the project's), before
    the hub serves anything.  A failure stops the hub with its reason."""
    import asyncio

    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return  # not inside the hub
    loop.call_soon(_install_in_hub, network, ports)


def _install_in_hub(network: str, ports: list[int]) -> None:
    from jupyterhub.app import JupyterHub

    firewall = HostFirewall(config=JupyterHub.instance().config)
    if not firewall.enabled:
        log.warning("c.HostFirewall.enabled is False: users' containers reach each other and every "
                    "port of this host unless this host's own firewall stops them")
        return
    try:
        import docker

        attrs = docker.from_env().api.inspect_network(network)
        added = install_for_network(attrs, [*ports, *firewall.allowed_ports], firewall.outbound)
    except Exception as exc:
        raise SystemExit(f"GPU JupyterHub: cannot install the host's rules for the bridge {network!r}: {exc}") from None
    if not icc_disabled(attrs):
        log.warning("The bridge %s was made without %s=false: its containers are kept apart by the "
                    "hub's rule in %s only (needs br_netfilter); remove the network while no server "
                    "runs and restart the hub to have Docker's own rule too", network, ICC_OPTION, FORWARD_CHAIN)
    JupyterHub.instance().log.info("Host rules for the bridge %s: %s added; containers reach ports %s of %s",
                                   network, added, ", ".join(map(str, sorted({*ports, *firewall.allowed_ports}))),
                                   attrs["IPAM"]["Config"][0]["Gateway"])


def _listed(chain: str) -> list[list[str]]:
    """The rules of `chain` as argument lists (without `-A chain`); [] if it is not there."""
    done = _run(["-S", chain])
    return [line.split()[2:] for line in done.stdout.splitlines() if line.startswith("-A ")] \
        if done.returncode == 0 else []


def _value(rule: list[str], flag: str) -> str | None:
    return rule[rule.index(flag) + 1] if flag in rule else None


def withdraw(bridge: str, gateway: str, ports: Iterable[int]) -> int:
    """Delete the openings of a hub gone for good (the tests' hubs: many on one bridge, each
    with its own ports), and the bridge's other rules once no hub's opening is left on it;
    the number deleted.  The cluster bridges' refusals stay."""
    wanted = {str(p) for p in ports}
    deleted = 0
    for rule in _listed(INPUT_CHAIN):
        if _value(rule, "--dport") in wanted and _value(rule, "-d") == f"{gateway}/32":
            deleted += _run(["-D", INPUT_CHAIN, *rule]).returncode == 0
    if any(_value(r, "-i") == bridge and "--dport" in r for r in _listed(INPUT_CHAIN)):
        return deleted
    for chain in (INPUT_CHAIN, FORWARD_CHAIN):
        for rule in _listed(chain):
            if _value(rule, "-i") == bridge:
                deleted += _run(["-D", chain, *rule]).returncode == 0
    return deleted
