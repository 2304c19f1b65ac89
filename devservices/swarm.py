"""A real multi-node Docker Swarm on this machine, for the tests, the benchmarks and `make demo-swarm`.

The manager is the session's dockerd (`docker swarm init` on the docker0
gateway; it is never restarted or reconfigured, and leaves the swarm at the
end only if this session made it one).  The GPU nodes are worker dockerds in
containers (Docker-in-Docker from a debootstrap base with Debian's docker.io,
cached by the hash of its inputs), each with its own simulated GPUs as Swarm
generic resources and node labels, and the NVIDIA *runtime* test double as
its default runtime: it records the NVIDIA_VISIBLE_DEVICES each container's
OCI bundle carries, then runs runc.  Everything made here carries the
`gpuhub-swarm-<session>` name prefix and the harness label, and is removed at
the end of the session.  A session killed before its end (SIGTERM or SIGKILL to
pytest, which runs no teardown) leaves its Swarm behind; each thing made here
also names its owner (the process's pid and start time, OWNER_LABEL), and the
next start_swarm removes what belongs to an owner that no longer runs.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HARNESS_LABEL = "org.jupyter.gpuhub.swarm-harness"
# "<pid>:<start time>" of the process that made it: a pid alone may be reused by then.
OWNER_LABEL = f"{HARNESS_LABEL}.owner"
# On the manager's node, when start_swarm made it a manager: the owner that should leave.
INITED_BY_LABEL = "gpuhub.harness-inited-by"
NODE_PACKAGES = "docker.io,iptables,ca-certificates,procps"
NODE_REPO = "gpuhub/swarm-node"
# Where a node container finds the runtime double and writes its records.
DOUBLE_DIR = "/gpuhub-double"

# The NVIDIA runtime double: what nvidia-container-runtime would see (the
# bundle's config.json) is recorded, then runc does the real work.
RUNTIME_DOUBLE = r"""#!/bin/sh
# Test double of nvidia-container-runtime: on `create`, record the container id
# and the NVIDIA_VISIBLE_DEVICES of its OCI bundle, then run runc as given.
bundle=""; prev=""; last=""; create=""
for a in "$@"; do
    case "$prev" in --bundle|-b) bundle="$a" ;; esac
    [ "$a" = create ] && create=1
    prev="$a"; last="$a"
done
if [ -n "$create" ] && [ -n "$bundle" ] && [ -f "$bundle/config.json" ]; then
    vis=$(grep -o '"NVIDIA_VISIBLE_DEVICES=[^"]*"' "$bundle/config.json" | head -n1 | tr -d '"' | cut -d= -f2-)
    echo "$last ${vis:-<unset>}" >> __DIR__/records/visible.log
fi
exec runc "$@"
"""


def in_parallel(fn, *argument_tuples) -> None:
    """fn(*args) for each tuple at once; the first error is raised in the caller's thread."""
    errors: list[BaseException] = []

    def run(args):
        try:
            fn(*args)
        except BaseException as exc:  # re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(a,), daemon=True) for a in argument_tuples]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


class SwarmUnavailable(RuntimeError):
    """The Swarm could not be made here; str() says why."""


def docker(*args: str, input: bytes | None = None, check: bool = True, timeout: float = 120) -> str:
    proc = subprocess.run(["docker", *args], input=input, capture_output=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args[:3])}... failed: {proc.stderr.decode(errors='replace')[-1500:]}")
    return proc.stdout.decode(errors="replace").strip()


def process_start(pid: int) -> str:
    """The start time of process `pid` (clock ticks since boot, /proc/<pid>/stat), '' if none runs."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    # The command name (field 2) is in parentheses and may hold spaces; start time is field 22.
    return stat.rsplit(")", 1)[1].split()[19]


def this_owner() -> str:
    return f"{os.getpid()}:{process_start(os.getpid())}"


def owner_alive(owner: str) -> bool:
    """Whether the process that `owner` (an OWNER_LABEL value) names still runs."""
    pid, _, start = owner.partition(":")
    return pid.isdigit() and bool(start) and process_start(int(pid)) == start


def harness_labels(session: str) -> list[str]:
    """The `--label` arguments of everything the harness makes for `session`."""
    return ["--label", f"{HARNESS_LABEL}={session}", "--label", f"{OWNER_LABEL}={this_owner()}"]


def abandoned_sessions() -> set[str]:
    """Sessions whose containers, services, volumes or networks name an owner that no longer runs."""
    dead: set[str] = set()
    listings = [("ps", "-a", "--filter", f"label={HARNESS_LABEL}", "--format", "{{.Labels}}"),
                ("volume", "ls", "--filter", f"label={HARNESS_LABEL}", "--format", "{{.Labels}}"),
                ("network", "ls", "--filter", f"label={HARNESS_LABEL}", "--format", "{{.Labels}}")]
    for listing in listings:
        for line in docker(*listing, check=False).splitlines():
            labels = dict(part.partition("=")[::2] for part in line.split(","))
            session, owner = labels.get(HARNESS_LABEL, ""), labels.get(OWNER_LABEL, "")
            if session and owner and not owner_alive(owner):
                dead.add(session)
    return dead


def remove_abandoned() -> list[str]:
    """Remove the Swarm of every session whose owner is gone (see the module's docstring);
    the manager leaves the swarm too when such a session made it one and no live session
    is left on it.  Returns the sessions removed."""
    sessions = sorted(abandoned_sessions())
    for session in sessions:
        nodes = docker("node", "ls", "-q", "--filter", f"node.label=gpuhub.test-session={session}",
                       check=False).split()
        stop_swarm(Swarm(session=session, manager_addr="", network=f"gpuhub-swarm-{session}",
                         homes_root=Path("/nonexistent"), inited_here=False, node_image="",
                         nodes=[SwarmNode(container="", hostname="", gpus=[], labels={},
                                          state_dir=Path("/nonexistent"), node_id=n) for n in nodes]))
        for base in Path("/var/tmp").glob(f"gpuhub-swarm-{session}-*"):
            shutil.rmtree(base, ignore_errors=True)
    inited_by = docker("node", "inspect", docker("info", "--format", "{{.Swarm.NodeID}}", check=False) or "self",
                       "--format",
                       f'{{{{index .Spec.Labels "{INITED_BY_LABEL}"}}}}', check=False)
    if inited_by and not owner_alive(inited_by) and not docker(
            "ps", "-aq", "--filter", f"label={HARNESS_LABEL}", check=False):
        docker("swarm", "leave", "--force", check=False)
    return sessions


@dataclass
class SwarmNode:
    """A worker dockerd in a container, joined to the swarm."""

    container: str  # the container holding the dockerd
    hostname: str  # the Swarm node's hostname: the pool's host name
    gpus: list[str]
    labels: dict[str, str]
    state_dir: Path  # host side of DOUBLE_DIR
    node_id: str = ""
    ip: str = ""

    def docker(self, *args: str, **kwargs) -> str:
        """The docker CLI against this node's own dockerd."""
        return docker("exec", self.container, "docker", *args, **kwargs)

    def visible_devices(self) -> dict[str, str]:
        """container id on this node -> NVIDIA_VISIBLE_DEVICES its runtime saw ('<unset>' if none)."""
        log = self.state_dir / "records" / "visible.log"
        if not log.exists():
            return {}
        seen = {}
        for line in log.read_text().splitlines():
            cid, _, value = line.partition(" ")
            seen[cid] = value
        return seen

    def running(self) -> bool:
        return docker("inspect", "-f", "{{.State.Running}}", self.container, check=False) == "true"


@dataclass
class Swarm:
    session: str
    manager_addr: str
    network: str  # attachable overlay for the hub, its proxy and user tasks
    homes_root: Path  # the "shared storage": the same path on every node
    nodes: list[SwarmNode]
    inited_here: bool
    node_image: str
    _loaded: set = field(default_factory=set)

    def node(self, hostname: str) -> SwarmNode:
        return next(n for n in self.nodes if n.hostname == hostname)

    def load_image(self, image: str) -> None:
        """Put `image` on every worker (docker save | docker load), unless it has the tag."""
        def one(node: SwarmNode):
            if node.docker("image", "inspect", "--format", "{{.Id}}", image, check=False):
                return
            save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
            load = subprocess.run(["docker", "exec", "-i", node.container, "docker", "load"],
                                  stdin=save.stdout, capture_output=True, timeout=600)
            save.stdout.close()
            save.wait()
            if load.returncode != 0 or save.returncode != 0:
                raise RuntimeError(f"loading {image} into {node.container} failed: {load.stderr[-800:]!r}")

        in_parallel(one, *[(n,) for n in self.nodes if (n.container, image) not in self._loaded])
        self._loaded.update((n.container, image) for n in self.nodes)

    def task_of(self, service: str) -> dict | None:
        """The current task of a service (the running one if any)."""
        out = docker("service", "ps", "--no-trunc", "--format", "{{json .}}", service, check=False)
        rows = [json.loads(line) for line in out.splitlines() if line.strip()]
        return rows[0] if rows else None

    def task_container(self, service: str) -> tuple[SwarmNode, str] | None:
        """(node, container id) of a service's running task."""
        ids = docker("service", "ps", "-q", "--no-trunc", "--filter", "desired-state=running", service,
                     check=False).split()
        for task_id in ids:
            info = json.loads(docker("inspect", task_id))[0]
            cid = ((info.get("Status") or {}).get("ContainerStatus") or {}).get("ContainerID")
            node = next((n for n in self.nodes if n.node_id == info.get("NodeID")), None)
            if cid and node:
                return node, cid
        return None


def node_image() -> str:
    """The worker node image: images/build-base.sh with docker.io, cached by its inputs' hash."""
    env = {**os.environ, "BASE_PACKAGES": NODE_PACKAGES, "BASE_REPO": NODE_REPO}
    proc = subprocess.run(["bash", str(REPO / "images" / "build-base.sh")], env=env, capture_output=True,
                          text=True, timeout=1800)
    if proc.returncode != 0:
        raise SwarmUnavailable(f"building the Swarm node image failed: {proc.stderr[-1500:]}")
    return proc.stdout.strip().splitlines()[-1]


def simulated_uuid(hostname: str, index: int) -> str:
    from spawner.inventory import SimulatedInventory

    return SimulatedInventory.uuid_for(hostname, index)


def _start_node(session: str, index: int, image: str, gpus: int, labels: dict[str, str],
                base: Path, homes_root: Path, no_new_privileges: bool = True) -> SwarmNode:
    name = f"gpuhub-swarm-{session}-node{index}"
    hostname = f"gpunode{index}-{session}"
    state = base / f"node{index}"
    (state / "records").mkdir(parents=True)
    script = state / "nvidia-runtime"
    script.write_text(RUNTIME_DOUBLE.replace("__DIR__", DOUBLE_DIR))
    script.chmod(0o755)
    uuids = [simulated_uuid(hostname, i) for i in range(gpus)]
    volume = f"{name}-lib"
    docker("volume", "create", *harness_labels(session), volume)
    cmd = ["dockerd", "--host", "unix:///var/run/docker.sock", "--storage-driver", "overlay2",
           "--add-runtime", f"nvidia={DOUBLE_DIR}/nvidia-runtime", "--default-runtime", "nvidia"]
    if no_new_privileges:
        # Swarm cannot set no-new-privileges per service on this Docker: the daemon does.
        cmd.append("--no-new-privileges")
    for uuid in uuids:
        cmd += ["--node-generic-resource", f"GPU={uuid}"]
    docker("run", "-d", "--name", name, "--hostname", hostname, *harness_labels(session),
           "--cap-add", "ALL", "--cap-drop", "SYS_RESOURCE",
           "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
           "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw", "--tmpfs", "/run",
           "-v", f"{volume}:/var/lib/docker", "-v", f"{state}:{DOUBLE_DIR}",
           "-v", f"{homes_root}:{homes_root}",
           image, *cmd)
    node = SwarmNode(container=name, hostname=hostname, gpus=uuids, labels=labels, state_dir=state)
    deadline = time.monotonic() + 60
    while node.docker("info", "--format", "{{.ID}}", check=False) == "":
        if time.monotonic() > deadline or not node.running():
            logs = docker("logs", "--tail", "20", name, check=False)
            raise RuntimeError(f"the dockerd in {name} did not start:\n{logs}")
        time.sleep(0.5)
    node.ip = docker("inspect", "-f", "{{.NetworkSettings.IPAddress}}", name)
    return node


def _docker0_gateway() -> str:
    out = docker("network", "inspect", "bridge", "-f", "{{(index .IPAM.Config 0).Gateway}}")
    return out or "172.17.0.1"


def start_swarm(session: str | None = None, gpus_per_node: int = 2, homes_root: Path | None = None) -> Swarm:
    """Make the manager a swarm manager (if it is not one), start two GPU workers and join them.

    `homes_root`: the directory standing in for shared storage (kept); by default one
    inside the harness's temporary directory (removed with the swarm)."""
    session = session or secrets.token_hex(3)
    remove_abandoned()
    state = docker("info", "--format", "{{.Swarm.LocalNodeState}}")
    gateway = _docker0_gateway()
    inited = False
    if state == "inactive":
        docker("swarm", "init", "--advertise-addr", gateway, "--listen-addr", f"{gateway}:2377")
        docker("node", "update", "--label-add", f"{INITED_BY_LABEL}={this_owner()}",
               docker("info", "--format", "{{.Swarm.NodeID}}"))
        inited = True
    elif state != "active":
        raise SwarmUnavailable(f"the session dockerd's swarm state is {state!r}")
    if docker("info", "--format", "{{.Swarm.ControlAvailable}}") != "true":
        raise SwarmUnavailable("the session dockerd is in a swarm but not a manager")
    manager_addr = docker("info", "--format", "{{.Swarm.NodeAddr}}")
    token = docker("swarm", "join-token", "-q", "worker")
    image = node_image()
    base = Path(tempfile.mkdtemp(prefix=f"gpuhub-swarm-{session}-", dir="/var/tmp"))
    homes_root = Path(homes_root).resolve() if homes_root else base / "homes"
    homes_root.mkdir(parents=True, exist_ok=True)
    swarm = Swarm(session=session, manager_addr=manager_addr, network=f"gpuhub-swarm-{session}",
                  homes_root=homes_root, nodes=[], inited_here=inited, node_image=image)
    swarm._base = base  # type: ignore[attr-defined]
    try:
        specs = [(1, {"gpu.model": "a100", "gpu.memory": "80g"}), (2, {"gpu.model": "t4", "gpu.memory": "16g"})]
        for index, labels in specs:
            swarm.nodes.append(_start_node(session, index, image, gpus_per_node, labels, base, homes_root))
        _join(swarm, swarm.nodes, token)
        # Not `--opt encrypted` (the production recipe's): this machine's kernel may lack ESP
        # (CONFIG_INET_ESP), and then nothing would cross nodes; the jobs' overlays follow it.
        docker("network", "create", "--driver", "overlay", "--attachable",
               *harness_labels(session), swarm.network)
    except BaseException:
        stop_swarm(swarm)
        raise
    return swarm


def _join(swarm: Swarm, nodes: list[SwarmNode], token: str) -> None:
    """Join `nodes` to the swarm as workers, label them, and wait until they are ready."""
    for node in nodes:
        node.docker("swarm", "join", "--token", token, "--advertise-addr", node.ip, f"{swarm.manager_addr}:2377")
        node.node_id = node.docker("info", "--format", "{{.Swarm.NodeID}}")
        args = []
        for key, value in {**node.labels, "gpuhub.test-session": swarm.session}.items():
            args += ["--label-add", f"{key}={value}"]
        docker("node", "update", *args, node.node_id)
    deadline = time.monotonic() + 60
    while not all(docker("node", "inspect", "-f", "{{.Status.State}}", n.node_id) == "ready" for n in nodes):
        if time.monotonic() > deadline:
            raise RuntimeError("the worker nodes did not become ready")
        time.sleep(0.5)


def add_node(swarm: Swarm, index: int, labels: dict[str, str], gpus: int = 2,
             no_new_privileges: bool = True) -> SwarmNode:
    """One more GPU worker (node `index`), joined and ready, with the images loaded on the others.
    `no_new_privileges=False`: its dockerd does not enforce it (a node an admin forgot)."""
    base = swarm._base  # type: ignore[attr-defined]
    node = _start_node(swarm.session, index, swarm.node_image, gpus, labels, base, swarm.homes_root,
                       no_new_privileges)
    swarm.nodes.append(node)
    _join(swarm, [node], docker("swarm", "join-token", "-q", "worker"))
    for image in {image for _, image in swarm._loaded}:
        swarm.load_image(image)
    return node


def remove_node(swarm: Swarm, node: SwarmNode) -> None:
    """Take a node added by add_node out of the swarm and remove its dockerd."""
    node.docker("swarm", "leave", "--force", check=False)
    if node.node_id:
        docker("node", "rm", "--force", node.node_id, check=False)
    docker("rm", "-f", "-v", node.container, check=False, timeout=180)
    docker("volume", "rm", "-f", f"{node.container}-lib", check=False)
    swarm.nodes.remove(node)


def stop_swarm(swarm: Swarm) -> None:
    """Remove everything the harness made (services and containers first, then nodes and the swarm)."""
    prefix = f"gpuhub-swarm-{swarm.session}"
    for service in docker("service", "ls", "-q", "--filter", f"label={HARNESS_LABEL}={swarm.session}",
                          check=False).split():
        docker("service", "rm", service, check=False)
    for container in docker("ps", "-aq", "--filter", f"label={HARNESS_LABEL}={swarm.session}",
                            check=False).split():
        docker("rm", "-f", "-v", container, check=False, timeout=180)
    for node in swarm.nodes:
        if node.node_id:
            docker("node", "rm", "--force", node.node_id, check=False)
    for volume in docker("volume", "ls", "-q", "--filter", f"label={HARNESS_LABEL}={swarm.session}",
                         check=False).split():
        docker("volume", "rm", "-f", volume, check=False)
    docker("network", "rm", swarm.network, check=False)
    if swarm.inited_here:
        docker("swarm", "leave", "--force", check=False)
    base = getattr(swarm, "_base", None)
    if base and str(base).startswith("/var/tmp/") and prefix in str(base):
        shutil.rmtree(base, ignore_errors=True)


# ------------------------------------------------------------------ the hub on Swarm
#
# Host processes cannot reach overlay addresses, so the hub (and the proxy it
# starts) runs in the network namespace of a sleeping helper container that is
# on the default bridge (where the host reaches the proxy) and on the overlay
# (where the servers on every node reach the hub).  It is the real hub
# process of this checkout, entered into that namespace with nsenter; it
# reaches the manager's Docker socket and, through forwarders on the docker0
# gateway, services that listen on the host's loopback (PostgreSQL, a directory).


@dataclass
class HubSite:
    container: str
    pid: int
    bridge_ip: str
    overlay_ip: str

    @property
    def launcher(self) -> list[str]:
        """The command prefix that runs a program in the site's network namespace."""
        return ["nsenter", f"--net=/proc/{self.pid}/ns/net", "--"]


def start_hub_site(swarm: Swarm, image: str, index: int) -> HubSite:
    name = f"gpuhub-swarm-{swarm.session}-hub{index}"
    docker("run", "-d", "--name", name, *harness_labels(swarm.session),
           "--network", "bridge", "--entrypoint", "sleep", image, "infinity")
    docker("network", "connect", swarm.network, name)
    info = json.loads(docker("inspect", name))[0]
    networks = info["NetworkSettings"]["Networks"]
    return HubSite(name, info["State"]["Pid"], networks["bridge"]["IPAddress"],
                   networks[swarm.network]["IPAddress"])
