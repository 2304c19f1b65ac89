"""A real JupyterHub (with its configurable-http-proxy), as the tests and the benchmarks run it.

`prepare_hub(directory, image, network)` makes a `Hub`: `jupyterhub` on 127.0.0.1 with the
project's hub_config/jupyterhub_config.py, in its own directory, with simulated GPUs, the
given notebook image and a service token with the admin role; callers drive it only through
the REST API (`hub.api(...)`).  tests/fixtures/hub.py wraps it in the `make_hub` fixture.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests

from .ports import free_port
from .waiting import until

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "test-artifacts"
DUMMY_PASSWORD = "test-password-not-secret"


def wait_for(predicate, timeout: float = 30.0, what: str | None = None, hub: Hub | None = None,
             interval: float = 0.3):
    """devservices.waiting.until, with the hub's log tail in the message when it times out."""
    return until(predicate, timeout, what, interval, explain=(lambda: hub.log_tail(80)) if hub else None)


def _chp_available() -> bool:
    return shutil.which("configurable-http-proxy") is not None


def ensure_chp() -> None:
    """configurable-http-proxy comes from the npm registry."""
    if _chp_available():
        return
    if shutil.which("npm"):
        subprocess.run(["npm", "install", "-g", "--silent", "configurable-http-proxy"],
                       capture_output=True, text=True)
    if not _chp_available():
        raise RuntimeError("configurable-http-proxy is not installed (npm install -g configurable-http-proxy)")


# The idle culler lists the users at the start of each round; the hub logs that request.
CULL_ROUND = re.compile(r"GET /hub/api/users\?state=\S* \(idle-culler@")


# A test waits for a spawn as long as the hub itself would: the container's start
# (GPUDockerSpawner.container_start_timeout, 120 s) and then the server's answer (http_timeout,
# 120 s).  At 120 s in all, a fresh run under load gave up on a Swarm server that the hub was
# still, rightly, waiting for (its task started 92 s after the service was made).
SPAWN_BOUND = 240.0


@dataclass
class Hub:
    directory: Path
    env: dict
    config_file: Path
    port: int
    token: str
    prefix: str
    log_path: Path
    process: subprocess.Popen | None = None
    scheme: str = "http"  # "https" when the hub serves TLS itself (GPUHUB_SSL_CERT)
    verify: str | bool = True  # requests' `verify`: the CA bundle of a test CA
    _log_files: list = field(default_factory=list)
    _ledger: object = None
    address: str = "127.0.0.1"  # where the test reaches the proxy (a container's address on Swarm)
    launcher: list = field(default_factory=list)  # a command prefix, e.g. nsenter into a network namespace

    @property
    def pool_db_url(self) -> str:
        """The hub's GPU ledger (GPUHUB_POOL_DB_URL's default under its data dir)."""
        return self.env.get("GPUHUB_POOL_DB_URL") or f"sqlite:///{self.directory / 'gpu-pool.sqlite'}"

    def ledger(self):
        """A GPUPool on the hub's ledger, to read (and, as an admin would, change) it."""
        if self._ledger is None:
            from spawner.pool import GPUPool

            self._ledger = GPUPool(db_url=self.pool_db_url)
        return self._ledger

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.address}:{self.port}"

    def api(self, method: str, path: str, token: str | None = None, **kwargs) -> requests.Response:
        headers = kwargs.pop("headers", {})
        headers.setdefault("Authorization", f"token {token or self.token}")
        kwargs.setdefault("timeout", 30)
        kwargs.setdefault("verify", self.verify)
        return requests.request(method, f"{self.url}/hub/api{path}", headers=headers, **kwargs)

    # -- process control -------------------------------------------------
    def start(self, timeout: float = 90) -> Hub:
        log = open(self.log_path, "ab")  # noqa: SIM115 (closed in stop(), with the hub)
        self._log_files.append(log)
        self.process = subprocess.Popen(
            [*self.launcher, sys.executable, "-m", "jupyterhub", "-f", str(self.config_file), "--debug"],
            cwd=self.directory, env=self.env, stdout=log, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the hub exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                if self.api("GET", "/", timeout=2).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"the hub did not answer within {timeout} s:\n{self.log_tail()}")

    def stop(self, timeout: float = 60) -> None:
        """SIGTERM, as an admin would; the hub then stops its servers (cleanup_servers)."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._stop_proxy()

    def kill(self) -> None:
        """SIGKILL: the hub gets no chance to clean up (its proxy survives, as in real life)."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def _stop_proxy(self) -> None:
        pid_file = self.directory / "jupyterhub-proxy.pid"
        if pid_file.exists():
            with contextlib.suppress(ValueError, ProcessLookupError, PermissionError):
                os.kill(int(pid_file.read_text().strip()), signal.SIGTERM)

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    # -- helpers for tests -------------------------------------------------
    def metric(self, name: str) -> float:
        """The sum of a counter's samples on /hub/metrics (0 when it has none yet)."""
        r = requests.get(f"{self.url}/hub/metrics", headers={"Authorization": f"token {self.token}"},
                         timeout=10, verify=self.verify)
        r.raise_for_status()
        total = 0.0
        for line in r.text.splitlines():
            sample, _, value = line.rpartition(" ")
            if sample.split("{", 1)[0] == f"{name}_total":
                total += float(value)
        return total

    def wait_reconcile_passes(self, passes: int, timeout: float = 60) -> None:
        """Return once the hub's reconciler has run `passes` more passes (whatever their outcome)."""
        target = self.metric("gpuhub_reconcile_passes") + passes
        wait_for(lambda: self.metric("gpuhub_reconcile_passes") >= target, timeout=timeout,
                 what=f"{passes} reconcile passes", hub=self)

    def cull_rounds(self) -> int:
        """How many rounds the idle culler has begun: each starts by listing the users (as the hub logs)."""
        return len(CULL_ROUND.findall(self.log_path.read_text(errors="replace")))

    def wait_cull_rounds(self, rounds: int, timeout: float = 60) -> None:
        """Return once the idle culler has done `rounds` more whole rounds.

        Rounds never overlap (the culler's PeriodicCallback awaits each), so the start of
        the (rounds + 1)th new one means `rounds` whole ones ran after this call."""
        target = self.cull_rounds() + rounds + 1
        wait_for(lambda: self.cull_rounds() >= target, timeout=timeout, what=f"{rounds} idle-culler rounds",
                 hub=self)

    def create_user(self, name: str, admin: bool = False) -> dict:
        r = self.api("POST", f"/users/{name}", json={"admin": admin})
        assert r.status_code in (201, 409), r.text
        return self.api("GET", f"/users/{name}").json()

    def user_token(self, name: str) -> str:
        r = self.api("POST", f"/users/{name}/tokens", json={"note": "test", "expires_in": 3600})
        assert r.status_code == 201, r.text
        return r.json()["token"]

    def start_server(self, name: str, options: dict | None = None, server_name: str = "",
                     timeout: float = SPAWN_BOUND) -> dict:
        """POST the server and wait until the hub says it is ready."""
        path = f"/users/{name}/server" + (f"s/{server_name}" if server_name else "")
        r = self.api("POST", path, json=options if options is not None else {})
        assert r.status_code in (201, 202), f"{r.status_code}: {r.text}"
        return self.wait_ready(name, server_name, timeout)

    def refused_spawn(self, name: str, options: dict) -> tuple[int, str]:
        """POST a spawn that must fail; its status (0 when it failed after the POST
        returned) and the message a user sees (from the answer, else the hub's log)."""
        r = self.api("POST", f"/users/{name}/server", json=options)
        if r.status_code not in (201, 202):
            return r.status_code, r.json().get("message", "")
        wait_for(lambda: self.server_model(name) is None, what=f"{name}'s spawn to fail", hub=self)
        return 0, self.log_tail(200)

    def server_model(self, name: str, server_name: str = "") -> dict | None:
        user = self.api("GET", f"/users/{name}").json()
        return user.get("servers", {}).get(server_name)

    def wait_ready(self, name: str, server_name: str = "", timeout: float = SPAWN_BOUND) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            server = self.server_model(name, server_name)
            if server and server.get("ready"):
                return server
            if server is None:
                # the POST was accepted, so a vanished server is a failed spawn
                raise AssertionError(f"spawn of {name}/{server_name} failed:\n{self.log_tail()}")
            time.sleep(0.5)
        raise AssertionError(f"{name}/{server_name} not ready in {timeout} s:\n{self.log_tail()}")

    def stop_server(self, name: str, server_name: str = "", token: str | None = None,
                    timeout: float = 60) -> None:
        path = f"/users/{name}/server" + (f"s/{server_name}" if server_name else "")
        r = self.api("DELETE", path, token=token)
        assert r.status_code in (202, 204), f"{r.status_code}: {r.text}"
        self.wait_stopped(name, server_name, timeout)

    def wait_stopped(self, name: str, server_name: str = "", timeout: float = 60) -> None:
        until(lambda: self.server_model(name, server_name) is None, timeout, f"{name}/{server_name} to stop",
              interval=0.3, explain=self.log_tail)

    def containers(self, docker_client, all: bool = True) -> list:
        return [c for c in docker_client.containers.list(all=all, ignore_removed=True)
                if c.name.startswith(f"{self.prefix}-")]


def prepare_hub(directory: Path, notebook_image: str, network_name: str, extra_config: str = "",
                env: dict | None = None) -> Hub:
    """Write a hub's config into `directory` and return the (not yet started) Hub.

    Used by the `make_hub` fixture and by the benchmarks."""
    token = secrets.token_hex(24)
    prefix = f"gpuhub-t{secrets.token_hex(3)}"
    port, hub_port, api_port = free_port(), free_port(), free_port()
    scheme = "https" if (env or {}).get("GPUHUB_SSL_CERT") else "http"
    config_file = directory / "jupyterhub_config.py"
    config_file.write_text(textwrap.dedent(f"""
        load_subconfig({str(REPO / 'hub_config' / 'jupyterhub_config.py')!r})
        # append, so the project's own services (the idle culler) stay
        c.JupyterHub.services.append({{"name": "test-admin", "api_token": {token!r}}})
        c.JupyterHub.load_roles.append({{"name": "admin", "services": ["test-admin"]}})
        c.GPUDockerSpawner.remove = True
    """) + "\n" + textwrap.dedent(extra_config))
    hub_env = {
        **os.environ,
        "GPUHUB_BIND_URL": f"{scheme}://127.0.0.1:{port}",
        "GPUHUB_HUB_PORT": str(hub_port),
        "GPUHUB_PROXY_API_PORT": str(api_port),
        "GPUHUB_POOL_PAGE_PORT": str(free_port()),
        "GPUHUB_DATA_DIR": str(directory),
        "GPUHUB_DOCKER_NETWORK": network_name,
        "GPUHUB_CONTAINER_PREFIX": prefix,
        "GPUHUB_HOME_VOLUME": f"{prefix}-home-{{username}}",
        "GPUHUB_INVENTORY": "simulated",
        "GPUHUB_SIMULATED_GPUS": "4",
        "GPUHUB_CPU_IMAGE": notebook_image,
        "GPUHUB_GPU_IMAGE": notebook_image,
        "GPUHUB_AUTHENTICATOR": "dummy",
        "GPUHUB_DUMMY_PASSWORD": DUMMY_PASSWORD,
        "GPUHUB_CULL": "false",
        "GPUHUB_LEASE_WAIT_TIMEOUT": "60",
        "CONFIGPROXY_AUTH_TOKEN": secrets.token_hex(24),
        "PYTHONUNBUFFERED": "1",
    }
    hub_env.update(env or {})
    return Hub(directory=directory, env=hub_env, config_file=config_file, port=port, token=token,
               prefix=prefix, log_path=directory / "hub.log", scheme=scheme)


def remove_what_a_hub_made(docker_client, prefix: str, network: str, ports: list[int]) -> None:
    """Every container and volume named `<prefix>-...`, and the hub's openings in the host's rules
    (spawner/engines/common/firewall.py) on `network` for `ports`: its bridge's rules go once no other
    hub's are left, since many test hubs (and the demo's test) share one bridge."""
    import docker.errors

    from spawner.engines.common import firewall

    for container in docker_client.containers.list(all=True, ignore_removed=True):
        if not container.name.startswith(f"{prefix}-"):
            continue
        try:
            container.remove(force=True)
        except docker.errors.NotFound:
            pass  # gone meanwhile
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: Docker is removing it already
                raise
    for volume in docker_client.volumes.list():
        if volume.name.startswith(f"{prefix}-"):
            with contextlib.suppress(docker.errors.APIError):  # in use by a container going away
                volume.remove(force=True)
    if firewall.readable() is not None:
        return
    try:
        attrs = docker_client.api.inspect_network(network)
    except docker.errors.APIError:
        return
    firewall.withdraw(firewall.bridge_of(attrs), attrs["IPAM"]["Config"][0]["Gateway"], ports)


def cleanup_hub(hub: Hub, docker_client) -> None:
    """Stop the hub and remove every container and volume it made."""
    hub.stop()
    ports = [hub.env.get(k) for k in ("GPUHUB_HUB_PORT", "GPUHUB_POOL_PAGE_PORT")]
    remove_what_a_hub_made(docker_client, hub.prefix, hub.env["GPUHUB_DOCKER_NETWORK"],
                           [int(p) for p in ports if p] + [hub.port])
    if hub._ledger is not None:
        hub._ledger.close()
    for f in hub._log_files:
        f.close()
