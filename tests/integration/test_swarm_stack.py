"""The hub as a Swarm stack: `docker stack deploy` of hub_config/swarm-stack.yml on the harness's Swarm.

The stack file is deployed as shipped, swarm.env with its login section edited (the dummy login
instead of the directory), and a small override file this test writes for what differs on
this machine: the harness's overlay network, its PostgreSQL (a
forwarder on the docker0 gateway; the URL is the secret), the notebook image the harness built,
homes on the harness's shared directory, and simulated GPUs for the agent
(GPUHUB_AGENT_INVENTORY=simulated, with a utilisation file as a Docker config).  The image tag
is the stack file's own setting, GPUHUB_HUB_IMAGE.

The one change to the shipped file itself: the hub's published port is dropped.  Host mode
would listen on every interface of this machine, which the network rule forbids; the test
reaches the hub at its container's address on docker_gwbridge (the bridge Docker made on this
machine for the overlay's containers).  `--resolve-image never`: there is no registry here.

One Swarm per machine: this module is in the "swarm" work unit (tests/conftest.py); run it by
hand under `flock /tmp/gpuhub-exclusive.lock`.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from pathlib import Path

import pytest
import requests
import yaml

from devservices.postgres import create_database
from devservices.swarm_hub import remove_server_relays
from tests.fixtures.hub import DUMMY_PASSWORD, wait_for
from tests.fixtures.swarm import _docker0_gateway, docker

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SECRETS = ("gpuhub-pool-db-url", "gpuhub-agent-db-url", "gpuhub-cookie-secret", "gpuhub-crypt-key",
           "gpuhub-directory-bind-password")
UTILIZATION_FILE = "/etc/gpuhub/utilization.json"


# /proc/PID/status of the jupyterhub process, read inside the hub's container.
FIND_HUB_STATUS = """
import os
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\\0")
    except OSError:
        continue
    if any(arg.endswith(b"bin/jupyterhub") for arg in argv):
        print(open(f"/proc/{pid}/status").read())
        break
"""


class Stack:
    """A deployed stack: its files, its name, and the hub it runs."""

    def __init__(self, workdir: Path, name: str, swarm):
        self.workdir, self.name, self.swarm = workdir, name, swarm
        self.address = ""

    def deploy(self, image: str) -> str:
        env = {**os.environ, "GPUHUB_HUB_IMAGE": image}
        proc = subprocess.run(["docker", "stack", "deploy", "--resolve-image", "never", "--prune",
                               "-c", "swarm-stack.yml", "-c", "override.yml", self.name],
                              cwd=self.workdir, env=env, capture_output=True, text=True, timeout=180)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    def tasks(self, service: str) -> list[dict]:
        out = docker("service", "ps", "--no-trunc", "--filter", "desired-state=running", "--format", "{{json .}}",
                     f"{self.name}_{service}", check=False)
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def hub_container(self) -> str:
        return docker("ps", "-q", "--no-trunc", "--filter", f"label=com.docker.swarm.service.name={self.name}_hub",
                      "--filter", "status=running")

    def hub_log(self) -> str:
        """The hub's tasks (with Swarm's error for each) and its output: `docker service logs`
        writes the task's stderr, where JupyterHub logs, to its own stderr."""
        tasks = docker("service", "ps", "--no-trunc", "--format", "{{.Name}} {{.CurrentState}} {{.Error}}",
                       f"{self.name}_hub", f"{self.name}_agent", check=False)
        logs = subprocess.run(["docker", "service", "logs", "--tail", "80", "--raw", f"{self.name}_hub"],
                              capture_output=True, text=True, timeout=60)
        return f"{tasks}\n{logs.stdout}{logs.stderr}"

    @property
    def url(self) -> str:
        return f"http://{self.address}:8000"

    def wait_hub(self, not_container: str = "") -> str:
        """Wait for a running hub container (another than `not_container`) that answers; its id."""
        def answering():
            container = self.hub_container()
            if not container or container == not_container or "\n" in container:
                return None
            bridge = json.loads(docker("network", "inspect", "docker_gwbridge", "-f", "{{json .Containers}}"))
            address = (bridge.get(container) or {}).get("IPv4Address", "").split("/")[0]
            if not address:
                return None
            try:
                if requests.get(f"http://{address}:8000/hub/api", timeout=3).status_code != 200:
                    return None
            except requests.RequestException:
                return None
            self.address = address
            return container
        try:
            return wait_for(answering, timeout=180, what="the stack's hub answering", interval=1)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.hub_log()[-6000:]}") from None


def login_token(stack: Stack, name: str) -> str:
    """Log in through the hub's port as a browser does, then make an API token in that session."""
    session = requests.Session()
    session.get(f"{stack.url}/hub/login", timeout=30)
    r = session.post(f"{stack.url}/hub/login", timeout=30, allow_redirects=False, data={
        "username": name, "password": DUMMY_PASSWORD, "_xsrf": session.cookies.get("_xsrf")})
    assert r.status_code == 302 and session.cookies.get("jupyterhub-hub-login"), (r.status_code, r.text[-500:])
    r = session.post(f"{stack.url}/hub/api/users/{name}/tokens", json={"note": "stack test", "expires_in": 3600},
                     headers={"X-XSRFToken": session.cookies.get("_xsrf")}, timeout=30)
    assert r.status_code == 201, r.text
    return r.json()["token"]


def api(stack: Stack, token: str, method: str, path: str, **kwargs) -> requests.Response:
    return requests.request(method, f"{stack.url}/hub/api{path}", headers={"Authorization": f"token {token}"},
                            timeout=30, **kwargs)


def server(stack: Stack, token: str, user: str) -> dict | None:
    return api(stack, token, "GET", f"/users/{user}").json().get("servers", {}).get("")


def write_files(workdir: Path, swarm, notebook_image: str, prefix: str, utilization: dict, setting: str) -> None:
    base = yaml.safe_load((REPO / "hub_config" / "swarm-stack.yml").read_text())
    assert base["services"]["hub"]["ports"][0]["mode"] == "host"  # what production gets
    del base["services"]["hub"]["ports"]  # see the module's docstring
    (workdir / "swarm-stack.yml").write_text(yaml.safe_dump(base, sort_keys=False))
    # The login section edited as an admin would: the dummy login instead of the directory.  (An
    # empty value in the override's `environment` cannot unset a swarm.env line: `docker stack
    # deploy` drops it, and the hub then refused GPUHUB_DIRECTORY with the dummy login.)
    shipped = (REPO / "hub_config" / "swarm.env").read_text().splitlines()
    kept = [line for line in shipped if not line.startswith(("GPUHUB_AUTHENTICATOR=", "GPUHUB_DIRECTORY"))]
    assert len(kept) < len(shipped) - 5, "swarm.env's login section moved"
    kept += ["GPUHUB_AUTHENTICATOR=dummy", f"GPUHUB_DUMMY_PASSWORD={DUMMY_PASSWORD}"]
    (workdir / "swarm.env").write_text("\n".join(kept) + "\n")
    (workdir / "utilization.json").write_text(json.dumps(utilization))
    homes = str(swarm.homes_root)
    override = {
        "version": "3.8",
        "services": {
            "hub": {"environment": {
                "GPUHUB_ADMIN_USERS": "ada", "GPUHUB_DOCKER_NETWORK": swarm.network,
                "GPUHUB_CONTAINER_PREFIX": prefix, "GPUHUB_HOME_VOLUME": f"{prefix}-home-{{username}}",
                "GPUHUB_CPU_IMAGE": notebook_image,
                "GPUHUB_GPU_IMAGE": notebook_image,
                "GPUHUB_SWARM_HOME_OPTIONS": json.dumps({"type": "none", "o": "bind",
                                                         "device": f"{homes}/{{username}}"}),
                "GPUHUB_SWARM_HOMES_ROOT_OPTIONS": json.dumps({"type": "none", "o": "bind", "device": homes}),
                "GPUHUB_SWARM_CPU_CONSTRAINTS": f"node.labels.gpuhub.test-session=={swarm.session}",
                "GPUHUB_SWARM_NODE_LABELS": f"gpuhub.test-session={swarm.session}",
                "GPUHUB_CULL": "false",
                "GPUHUB_LEASE_WAIT_TIMEOUT": setting,
            }},
            "agent": {
                "environment": {"GPUHUB_AGENT_INVENTORY": "simulated", "GPUHUB_SIMULATED_GPUS": "2",
                                "GPUHUB_SIMULATED_UTILIZATION_FILE": UTILIZATION_FILE},
                "configs": [{"source": "utilization", "target": UTILIZATION_FILE, "mode": 0o444}],
            },
        },
        "networks": {"gpuhub": {"external": True, "name": swarm.network}},
        "configs": {"utilization": {"file": "./utilization.json"}},
    }
    (workdir / "override.yml").write_text(yaml.safe_dump(override, sort_keys=False))


@pytest.fixture
def stack(tmp_path, swarm_cluster, swarm_pg_forward, postgres_server, hub_image, notebook_image):
    swarm = swarm_cluster
    session = secrets.token_hex(3)
    name = f"gpuhub-stack-{session}"
    # The hub's image on the manager is where it was built; the agent's on every GPU node.
    swarm.load_image(hub_image)
    db = create_database(postgres_server, f"stack_{swarm.session}_{session}")
    db_in_containers = db.replace(f"127.0.0.1:{postgres_server.port}", f"{_docker0_gateway()}:{swarm_pg_forward.port}")
    values = {"gpuhub-pool-db-url": db_in_containers, "gpuhub-agent-db-url": db_in_containers,
              "gpuhub-cookie-secret": secrets.token_hex(32), "gpuhub-crypt-key": secrets.token_hex(32),
              "gpuhub-directory-bind-password": "not-used-by-the-dummy-login"}
    for secret_name, value in values.items():  # the recipe's `printf ... | docker secret create NAME -`
        docker("secret", "rm", secret_name, check=False)
        docker("secret", "create", secret_name, "-", input=value.encode())
    for node in swarm.nodes:
        docker("node", "update", "--label-add", "gpu=true", node.node_id)
    made = Stack(tmp_path, name, swarm)
    made.db_url = db  # type: ignore[attr-defined]
    made.prefix = f"gpuhub-s{session}"  # type: ignore[attr-defined]
    made.tags = []  # type: ignore[attr-defined]
    try:
        yield made
    finally:
        print(made.hub_log()[-6000:])
        docker("stack", "rm", name, check=False)
        wait_for(lambda: not docker("ps", "-aq", "--filter", f"label=com.docker.stack.namespace={name}", check=False),
                 timeout=120, what="the stack's containers gone")
        for service in docker("service", "ls", "-q", "--filter", f"name={made.prefix}-", check=False).split():
            docker("service", "rm", service, check=False)
        remove_server_relays(made.prefix)
        for secret_name in SECRETS:
            docker("secret", "rm", secret_name, check=False)
        for node in swarm.nodes:
            docker("node", "update", "--label-rm", "gpu", node.node_id, check=False)
        for tag in made.tags:  # type: ignore[attr-defined]
            docker("rmi", tag, check=False)
            for node in swarm.nodes:
                node.docker("rmi", tag, check=False)
        wait_for(lambda: docker("network", "ls", "-q", "--filter", f"name={name}_", check=False) == "",
                 timeout=60, what="the stack's networks gone")
        docker("volume", "rm", f"{name}_hub-data", check=False)


def test_the_stack_lends_a_worker_gpu_reports_readings_and_upgrades_keeping_the_server(
        stack, swarm_cluster, hub_image, notebook_image):
    swarm = swarm_cluster
    utilization = {uuid: 11.0 + 17 * i for i, uuid in enumerate(uuid for n in swarm.nodes for uuid in n.gpus)}
    write_files(stack.workdir, swarm, notebook_image, stack.prefix, utilization, setting="60")
    stack.deploy(hub_image)
    first = stack.wait_hub()

    # The hub runs as its unprivileged user, with the socket's group only.
    # (pid 1 is tini, started as root; the hub is the entrypoint's exec, its child.)
    hub_status = docker("exec", first, "python3", "-c", FIND_HUB_STATUS)
    assert "Uid:\t1000\t1000\t1000\t1000" in hub_status, hub_status
    assert "CapEff:\t0000000000000000" in hub_status and "NoNewPrivs:\t1" in hub_status, hub_status

    # A login through the hub's port, then a GPU server: it lands on a worker with its leased GPU.
    token = login_token(stack, "ada")
    r = api(stack, token, "POST", "/users/ada/server", json={"profile": "tf-gpu-1"})
    assert r.status_code in (201, 202), r.text
    ready = wait_for(lambda: (s := server(stack, token, "ada")) and s.get("ready") and s, timeout=180,
                     what="ada's server ready")
    lease = ready["state"]
    workers = {n.hostname: n for n in swarm.nodes}
    assert lease["gpu_host"] in workers, lease
    node, container = wait_for(lambda: swarm.task_container(f"{stack.prefix}-ada"), what="ada's task")
    assert node.hostname == lease["gpu_host"]
    assert node.visible_devices().get(container) == ",".join(lease["gpu_uuids"])
    task_before = swarm.task_of(f"{stack.prefix}-ada")["ID"]
    # Her task is on an overlay of its own, not the servers' one: the stack's hub (a container Swarm
    # manages, which Docker cannot join to a new overlay) reaches it through its relay (engines/swarm/relay.py).
    attachments = json.loads(docker("inspect", task_before))[0].get("NetworksAttachments") or []
    names = [a["Network"]["Spec"]["Name"] for a in attachments]
    assert len(names) == 1 and names[0].startswith(f"{stack.prefix}-ada-net-"), attachments

    # The agent: a global service, one task per GPU node (none on the manager), from the hub image;
    # its readings reach the pool service's API.
    wait_for(lambda: sorted(t["Node"] for t in stack.tasks("agent") if t["CurrentState"].startswith("Running"))
             == sorted(workers), timeout=90, what="an agent task running on each GPU node")

    def readings():
        r = requests.get(f"{stack.url}/services/gpu-pool/api/wait", headers={"Authorization": f"token {token}"},
                         timeout=30)
        return r.status_code == 200 and r.json()["utilization"]
    wait_for(lambda: (seen := readings()) and all(seen.get(u) == v for u, v in utilization.items()),
             timeout=120, what="the agents' readings on the pool API", interval=2)

    # An upgrade: a new image tag and a changed setting, the same command.  The hub is replaced;
    # the server keeps running with its lease, and the new hub adopts both.
    from spawner.pool import GPUPool

    ledger = GPUPool(db_url=stack.db_url)
    try:
        [active] = [le for le in ledger.leases() if le.user == "ada"]
        new_tag = f"gpuhub/hub:stack-upgrade-{stack.name[-6:]}"
        docker("tag", hub_image, new_tag)
        for n in swarm.nodes:
            n.docker("tag", hub_image, new_tag)
        stack.tags.append(new_tag)
        write_files(stack.workdir, swarm, notebook_image, stack.prefix, utilization, setting="61")
        stack.deploy(new_tag)
        second = stack.wait_hub(not_container=first)
        spec = json.loads(docker("service", "inspect", f"{stack.name}_hub"))[0]["Spec"]["TaskTemplate"]["ContainerSpec"]
        assert spec["Image"] == new_tag and "GPUHUB_LEASE_WAIT_TIMEOUT=61" in spec["Env"]
        assert second != first
        # the server was never stopped: the same task, still running, the same lease
        assert swarm.task_of(f"{stack.prefix}-ada")["ID"] == task_before
        assert swarm.task_container(f"{stack.prefix}-ada") == (node, container)
        token = login_token(stack, "ada")
        adopted = wait_for(lambda: (s := server(stack, token, "ada")) and s.get("ready") and s, timeout=60,
                           what="the new hub to show ada's server")
        assert adopted["state"]["gpu_lease_id"] == lease["gpu_lease_id"]
        [still] = [le for le in ledger.leases() if le.user == "ada"]
        assert still.id == active.id and still.gpu_uuids == active.gpu_uuids
        # ...and it works through the new hub: it checks ada's token with the new hub (found at
        # its new address: images' gpuhub_activity/hub_dns.py; with c-ares' cache it asked the old
        # one for minutes), then ada stops it and its GPU goes back
        def answers() -> bool:
            try:
                return requests.get(f"{stack.url}/user/ada/api/status", timeout=10,
                                    headers={"Authorization": f"token {token}"}).status_code == 200
            except requests.RequestException:
                return False
        wait_for(answers, timeout=60, what="ada's server answering her through the new hub", interval=1)
        r = api(stack, token, "DELETE", "/users/ada/server")
        assert r.status_code in (202, 204), r.text
        wait_for(lambda: server(stack, token, "ada") is None, timeout=90, what="ada's server stopped")
        wait_for(lambda: not [le for le in ledger.leases() if le.user == "ada"], timeout=60,
                 what="ada's lease ended")
        # The quick stop reached the adopted server (engines/swarm/stopping.py), in the new hub's own log.
        logs = subprocess.run(["docker", "logs", second], capture_output=True, text=True, timeout=60)
        assert "ada's server exited" in logs.stdout + logs.stderr, (logs.stdout + logs.stderr)[-3000:]
    finally:
        ledger.close()
