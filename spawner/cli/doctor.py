"""`gpu-pool doctor`: check, line by line, what a GPU host needs, and say how to fix each failure.

NVML, the inventory, Docker and its NVIDIA device path, a one-GPU container, the images, the
ledger and the data directory; each check gives ok / warn / FAIL, one line of detail and a fix.
This module gathers the facts; the pure checks and the results are in doctor_checks.py.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import make_url
from traitlets import TraitError
from traitlets.config import Config

from ..engines.common.labels import PREFIX
from ..inventory.machine import Inventory
from .doctor_checks import (  # noqa: F401 (the doctor's public names: gpu-pool, the tests)
    FAIL,
    OK,
    WARN,
    Result,
    _one_line,
    as_json,
    build_command,
    cuda_fit,
    data_dir_result,
    exit_status,
    host_rules_result,
    image_variant,
    overlay_result,
    render,
    version_at_least,
    visible_devices,
)

if TYPE_CHECKING:
    from docker import DockerClient

# The NVML and inventory checks import nothing of the hub's web stack (profiles need tornado,
# the spawner JupyterHub), so they also run on a bare GPU machine (bench/device_check.py).

_LOG = logging.getLogger("gpu-pool.doctor")
# Who holds the probe's short lease in the ledger (history shows it, ended as `doctor`).
PROBE_USER = "gpu-pool doctor"
BASE_IMAGE = "gpuhub/debian-base:latest"
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
LABEL_DOCTOR = f"{PREFIX}.doctor"  # on every container the doctor runs: gpu-probe, image-check
TOOLKIT_FIX = ("install the NVIDIA Container Toolkit (nvidia-container-toolkit), run "
               "`nvidia-ctk runtime configure --runtime=docker`, then restart dockerd")


@dataclass
class Target:
    """What the doctor looks at: the hub's configuration, read like the hub reads it."""

    config: Config
    data_dir: Path
    hub_user: str
    # Warnings about how the settings were read (the settings check reports them).
    notes: list = field(default_factory=list)


class Doctor:
    """Runs the checks in order; each adds Results.  Nothing here raises to the caller."""

    def __init__(self, target: Target):
        self.target = target
        self.results: list[Result] = []
        self.inventory: Inventory | None = None
        self.docker: DockerClient | None = None
        self.driver_cuda: tuple[int, int] | None = None

    def _docker(self) -> DockerClient:
        """The client check_docker made; its callers check first that Docker answered."""
        if self.docker is None:
            raise RuntimeError("Docker was used although it did not answer")
        return self.docker

    def add(self, check: str, status: str, detail: str, fix: str = "") -> None:
        self.results.append(Result(check, status, detail, fix))

    @property
    def kind(self) -> str:
        spawner = self.target.config.GPUDockerSpawner
        return str(spawner.get("inventory_kind", None) or "nvml").lower()

    def run(self) -> list[Result]:
        for step in (self.check_settings, self.check_nvml, self.check_inventory, self.check_docker,
                     self.check_host_rules, self.check_gpu_container, self.check_images, self.check_ledger,
                     self.check_swarm_nodes, self.check_directory, self.check_data_dir):
            try:
                step()
            except Exception as e:  # a check that broke is a failed check, never a traceback
                self.add(step.__name__.removeprefix("check_").replace("_", " "), FAIL, _one_line(e),
                         "report this as a bug in gpu-pool doctor")
        return self.results

    def check_swarm_nodes(self) -> None:
        """On a Swarm manager (inventory swarm): one line per node (cli/doctor_swarm.py)."""
        if self.kind != "swarm" or self.docker is None:
            return
        from ..inventory.swarm import SwarmInventory
        from ..pool import GPUPool
        from .doctor_swarm import node_results

        readings = None
        try:
            pool = GPUPool(config=self.target.config)
            try:
                readings = pool.gpu_readings(SwarmInventory(config=self.target.config).reading_max_age)
            finally:
                pool.close()
        except Exception as e:  # the ledger check says why; the nodes are still listed
            self.add("swarm nodes", WARN, f"the agents' GPU readings cannot be read: {_one_line(e)}")
        profiles = self._profiles() or []
        image = next((p.image for p in profiles if self._has_image(p.image)), None)
        guard = bool(self.target.config.GPUSwarmSpawner.get("generic_resource_guard", False))
        for result in node_results(self._docker().api, image, self.container_prefix, readings, _LOG, guard):
            self.results.append(result)

    def _has_image(self, image: str) -> bool:
        try:
            self._docker().images.get(image)
            return True
        except Exception:
            return False

    def check_settings(self) -> None:
        for note in self.target.notes:
            self.add("settings", WARN, *note)

    def check_directory(self) -> None:
        from .doctor_directory import CHECK, directory_result

        result = directory_result(self.target.config)
        if result is not None:
            status, detail, fix = result
            self.add(CHECK, {"ok": OK, "warn": WARN, "fail": FAIL}[status], detail, fix)

    def check_nvml(self) -> None:
        needed = self.kind == "nvml"
        status = FAIL if needed else WARN
        note = "" if needed else f" (not needed: the inventory is {self.kind})"
        try:
            import pynvml
        except ImportError:
            self.add("nvml", status, f"nvidia-ml-py is not installed{note}", "pip install nvidia-ml-py")
            return
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            self.add("nvml", status, f"NVML does not load: {e}{note}",
                     "install the NVIDIA driver (nvidia-smi must work), then retry")
            return
        try:
            driver = pynvml.nvmlSystemGetDriverVersion()
            cuda = pynvml.nvmlSystemGetCudaDriverVersion()
        except pynvml.NVMLError as e:
            self.add("nvml", status, f"NVML loads but cannot read the driver's version: {e}",
                     "check nvidia-smi; a driver and library of different versions need a reboot")
            return
        finally:
            pynvml.nvmlShutdown()
        driver = driver.decode() if isinstance(driver, bytes) else driver
        self.add("nvml", OK, f"driver {driver}, CUDA {cuda // 1000}.{(cuda % 1000) // 10}")

    def check_inventory(self) -> None:
        from ..inventory.kinds import inventory_from_config

        try:
            # As the hub's spawner builds it (lending.configured_inventory, with the kind given).
            self.inventory = inventory_from_config(self.kind, config=self.target.config)
            units = self.inventory.gpus()
            self.driver_cuda = self.inventory.cuda_driver_version()
        except Exception as e:
            self.inventory = None
            self.add("gpus", FAIL, f"the {self.kind} inventory cannot be read: {_one_line(e)}",
                     "fix NVML (above), or set GPUHUB_INVENTORY=static with c.StaticInventory.gpus_list")
            return
        mig = sum(1 for g in units if g.parent_uuid)
        cuda = f"{self.driver_cuda[0]}.{self.driver_cuda[1]}" if self.driver_cuda else "unknown"
        detail = (f"{len(units)} to lend on host {self.inventory.host} ({len(units) - mig} whole GPUs, "
                  f"{mig} MIG units; "
                  f"{self.kind} inventory, CUDA {cuda})")
        if not units:
            self.add("gpus", FAIL, detail, "check nvidia-smi: no healthy GPU was found")
        elif self.kind == "simulated":
            self.add("gpus", WARN, detail + ": fake GPUs, for demos and tests",
                     "set GPUHUB_INVENTORY=nvml on a GPU host")
        else:
            self.add("gpus", OK, detail)

    def check_docker(self) -> None:
        import docker

        try:
            self.docker = docker.from_env(timeout=30)
            version = self.docker.version()
            info = self.docker.info()
        except Exception as e:
            self.docker = None
            self.add("docker", FAIL, f"the Docker engine does not answer: {_one_line(e)}",
                     "start dockerd (systemctl start docker) and let the hub's user use its socket "
                     "(the docker group), or set DOCKER_HOST")
            return
        self.engine_version = str(version.get("Version", "?"))
        self.runtimes = sorted((info.get("Runtimes") or {}).keys())
        self.add("docker", OK, f"Docker Engine {self.engine_version} (API {version.get('ApiVersion', '?')}), "
                 f"runtimes: {', '.join(self.runtimes) or 'none'}")

    def check_host_rules(self) -> None:
        """One Docker host: the rules the hub installs so users' containers reach the hub, the
        gpu-pool service and the proxy only (engines/common/firewall.py)."""
        if self.docker is None:
            return
        import docker.errors

        network = str(self.target.config.GPUDockerSpawner.get("network_name", "") or "")
        if not network:
            # A config of one's own that names no network: DockerSpawner's default, Docker's
            # own `bridge`, where the hub installs no rules (it does so for the network the
            # project's settings make, GPUHUB_DOCKER_NETWORK).
            self.add("host rules", WARN, "c.GPUDockerSpawner.network_name is not set: servers run on Docker's "
                     "default bridge, where the hub installs no rules, so users' containers reach each other",
                     "use the project's jupyterhub_config.py (GPUHUB_DOCKER_NETWORK), or set network_name and "
                     "install the rules docs/how-it-works/security.md lists")
            return
        if self.kind == "swarm" or "swarm" in str(self.target.config.JupyterHub.get("spawner_class", "")).lower():
            try:
                attrs = self._docker().api.inspect_network(network)
            except docker.errors.NotFound:
                attrs = None
            self.results.append(overlay_result(network, attrs))
            return

        from ..engines.common import firewall

        if not firewall.HostFirewall(config=self.target.config).enabled:
            self.add("host rules", WARN, "c.HostFirewall.enabled is False: users' containers reach each other "
                     "and every port of this host unless this host's own firewall stops them",
                     "remove c.HostFirewall.enabled = False, or install the rules docs/how-it-works/security.md lists")
            return
        ports = firewall.config_ports(self.target.config)
        unreadable = firewall.readable()
        if unreadable:
            self.results.append(host_rules_result(network, None, False, unreadable, ports))
            return
        try:
            attrs = self._docker().api.inspect_network(network)
        except docker.errors.NotFound:
            self.results.append(host_rules_result(network, None, False, None, ports))
            return
        fw = firewall.HostFirewall(config=self.target.config)
        wanted = firewall.rules(firewall.bridge_of(attrs), attrs["IPAM"]["Config"][0]["Gateway"],
                                [*ports, *fw.allowed_ports], fw.outbound)
        self.results.append(host_rules_result(network, firewall.missing(wanted), firewall.icc_disabled(attrs),
                                              None, sorted({*ports, *fw.allowed_ports})))

    def _cdi_specs(self) -> list[str]:
        if not version_at_least(self.engine_version, (28, 2)):
            return []
        return sorted(str(p) for d in CDI_DIRS if os.path.isdir(d) for p in Path(d).iterdir()
                      if p.suffix in (".yaml", ".yml", ".json"))

    def _probe_image(self) -> str | None:
        """The configured CPU image, else the local base image, else any profile image here."""
        profiles = self._profiles() or []
        candidates = [p.image for p in profiles if not p.gpus] + [BASE_IMAGE] + [p.image for p in profiles]
        for image in candidates:
            try:
                self._docker().images.get(image)
                return image
            except Exception:
                continue
        return None

    def _probe_gpu(self, units) -> tuple[str | None, Any, str]:
        """A GPU for the probe, taken through the ledger: (uuid, release, how) or (None, None, why not).

        The probe takes a free GPU with a lease of its own (user PROBE_USER), ended with
        reason `doctor` right after; run during an upgrade it never touches a lent GPU.
        Where no ledger lends this host's GPUs yet, nothing is lent and any GPU will do.
        """
        from ..pool import EndReason, GPUPool, PoolError

        if self.inventory is None:  # `units` came from it
            raise RuntimeError("The GPU probe ran without an inventory")
        try:
            pool = GPUPool(config=self.target.config, inventory=self.inventory)
        except TraitError as e:
            return None, None, f"the ledger's URL is wrong ({e}), so no GPU can be taken safely"
        try:
            url = make_url(pool.db_url)
            if url.get_backend_name() == "sqlite" and url.database and not os.path.exists(url.database):
                pool.close()
                return units[0].uuid, None, "no ledger yet, so no GPU is lent"
            statuses = pool.gpus()
            lent_anywhere = {s.gpu.uuid for s in statuses if s.lease}
            if not any(s.gpu.host == self.inventory.host for s in statuses):
                pool.close()
                free = [u.uuid for u in units if u.uuid not in lent_anywhere]
                if not free:
                    return None, None, "the ledger lends these GPUs under another host name (see the ledger check)"
                return free[0], None, "the ledger lists none of this host's GPUs yet, so none is lent"
            lease = pool.try_acquire(PROBE_USER, f"probe-{uuid.uuid4().hex[:8]}", 1)
        except PoolError as e:
            pool.close()
            return None, None, f"the ledger cannot lend a GPU for the probe: {e}"
        if lease is None:
            counts = pool.counts()
            pool.close()
            return None, None, (f"no GPU of this host is free ({counts['lent']} lent, {counts['drained']} "
                                "drained, or held for queued spawns): the probe never takes a lent one")

        def release() -> None:
            try:
                pool.release(lease.id, EndReason.DOCTOR)
            finally:
                pool.close()

        return lease.gpu_uuids[0], release, f"lease {lease.id}"

    def check_gpu_container(self) -> None:
        """The NVIDIA device path (runtime, CDI or device driver) and a one-GPU container."""
        if self.docker is None:
            self.add("nvidia devices", FAIL, "not checked: Docker does not answer", "fix Docker first (above)")
            return
        cdi = self._cdi_specs()
        via = ("the nvidia runtime is registered" if "nvidia" in self.runtimes else
               f"CDI specs: {', '.join(cdi)}" if cdi else "")
        units = self.inventory.gpus() if self.inventory else []
        image = self._probe_image()
        if not units or image is None:
            why = "no GPU to lend" if not units else f"no local image to run (build one: {build_command('mkl')})"
            self.add("nvidia devices", OK if via else WARN, via or f"not tried: {why}")
            self.add("one-GPU container", WARN, f"not tried: {why}")
            return
        gpu, release, how = self._probe_gpu(units)
        if gpu is None:
            self.add("nvidia devices", OK if via else WARN, via or f"not tried: {how}")
            self.add("one-GPU container", WARN, f"not tried: {how}",
                     "run gpu-pool doctor again when a GPU is free (gpu-pool status shows them)")
            return
        try:
            environ = self._run_with_gpu(image, gpu)
        except Exception as e:
            message = str(getattr(e, "explanation", None) or e).strip()
            if "could not select device driver" in message:
                self.add("nvidia devices", FAIL, f"dockerd refused a GPU: {message}", TOOLKIT_FIX)
                self.add("one-GPU container", WARN, "not tried: dockerd gives no NVIDIA devices")
            elif "nvidia-container-cli" in message:
                self.add("nvidia devices", OK if via else WARN, via or "dockerd's nvidia device driver is there")
                self.add("one-GPU container", FAIL, f"the NVIDIA Container Toolkit could not set up {gpu}: {message}",
                         "check nvidia-smi and `nvidia-container-cli info` on the host, then restart dockerd")
            else:
                self.add("nvidia devices", OK if via else WARN, via or "not decided: the container failed")
                self.add("one-GPU container", FAIL, f"{image} with {gpu}: {_one_line(e)}",
                         "run the image by hand with --gpus to see Docker's full message")
            return
        finally:
            if release is not None:
                release()
        self.add("nvidia devices", OK, via or "dockerd's nvidia device driver accepts GPU requests")
        seen = visible_devices(environ)
        if seen == gpu:
            self.add("one-GPU container", OK, f"{image} given {gpu} ({how}) sees exactly that GPU")
        else:
            self.add("one-GPU container", FAIL, f"{image} given {gpu} sees NVIDIA_VISIBLE_DEVICES={seen!r}",
                     "make the nvidia runtime leave NVIDIA_VISIBLE_DEVICES to the device request "
                     "(no default value in daemon.json), then restart dockerd")

    @property
    def container_prefix(self) -> str:
        """GPUHUB_CONTAINER_PREFIX (c.GPUDockerSpawner.prefix), as the hub names its containers."""
        from dockerspawner import DockerSpawner

        return str(self.target.config.GPUDockerSpawner.get("prefix", None) or DockerSpawner.prefix.default_value)

    def _bounds(self) -> dict:
        """The hub's c.ContainerLimits for a helper, in docker-py's high-level keywords."""
        from ..engines.common.containers import ContainerLimits

        return ContainerLimits(config=self.target.config).host_config(helper=True)

    def _run_with_gpu(self, image: str, gpu: str) -> bytes:
        """Run `cat /proc/1/environ` as PID 1, no network, no capabilities, with one GPU."""
        import docker.types

        container = self._docker().containers.create(
            image, entrypoint=["cat", "/proc/1/environ"], command=[], network_mode="none",
            cap_drop=["ALL"], security_opt=["no-new-privileges"],
            name=f"{self.container_prefix}-doctor-{uuid.uuid4().hex[:8]}",
            labels={LABEL_DOCTOR: "gpu-probe"}, **self._bounds(), device_requests=[
                docker.types.DeviceRequest(driver="nvidia", device_ids=[gpu], capabilities=[["gpu"]])])
        try:
            container.start()
            container.wait(timeout=60)
            return container.logs(stdout=True, stderr=False)
        finally:
            container.remove(force=True)

    def _profiles(self):
        """The configured profiles, or None when they are malformed (check_images says so)."""
        from ..profiles import DEFAULT_PROFILES, ProfileConfigError, load_profiles

        try:
            return load_profiles(list(self.target.config.GPUDockerSpawner.get("profiles", None) or DEFAULT_PROFILES))
        except ProfileConfigError as e:
            self.profile_error = str(e)
            return None

    def check_images(self) -> None:
        profiles = self._profiles()
        if profiles is None:
            self.add("profiles", FAIL, self.profile_error, "fix c.GPUDockerSpawner.profiles / GPUHUB_PROFILES_FILE")
            return
        if self.docker is None:
            self.add("images", FAIL, "not checked: Docker does not answer", "fix Docker first (above)")
            return
        gpus: dict[str, int] = {}
        for p in profiles:
            gpus[p.image] = max(gpus.get(p.image, 0), p.gpus)
        for image, count in gpus.items():
            try:
                labels = self.docker.images.get(image).labels or {}
            except Exception as e:
                users = ", ".join(p.slug for p in profiles if p.image == image)
                variant = image_variant(image)
                self.add(f"image {image}", FAIL, f"not on this host (profiles {users}): {_one_line(e)}",
                         f"build it: {build_command(variant)}" if variant else
                         "build it here or `docker load` it: the hub never pulls images")
                continue
            self.results.append(cuda_fit(image, labels, count, self.driver_cuda))
            self.results.append(self._busy_kernel_check(image))

    def _busy_kernel_check(self, image: str) -> Result:
        """Does the image carry the gpuhub_activity extension (a busy kernel counts as activity)?"""
        name = f"image {image}: busy kernels"
        container = None
        try:
            container = self._docker().containers.create(
                image, entrypoint=["python3", "-c", "import gpuhub_activity"], command=[], network_mode="none",
                cap_drop=["ALL"], security_opt=["no-new-privileges"], user="65534:65534",
                name=f"{self.container_prefix}-doctor-{uuid.uuid4().hex[:8]}", labels={LABEL_DOCTOR: "image-check"},
                **self._bounds())
            container.start()
            code = container.wait(timeout=60).get("StatusCode")
        except Exception as e:
            return Result(name, WARN, f"could not look inside it: {_one_line(e)}")
        finally:
            if container is not None:
                with contextlib.suppress(Exception):
                    container.remove(force=True)
        if code == 0:
            return Result(name, OK, "the gpuhub_activity extension counts a working kernel as activity")
        return Result(name, WARN, "no gpuhub_activity extension: a cell that computes without printing looks "
                      "idle, and the culler may stop it", "install the extension in the image (images/jupyter/, "
                      "as images/Dockerfile does), or build it with `make images`")

    def check_ledger(self) -> None:
        from ..pool import GPUPool, HostConflict, PoolError, PoolUnavailable

        try:
            pool = GPUPool(config=self.target.config, inventory=self.inventory)
        except TraitError as e:
            self.add("ledger", FAIL, str(e), "fix c.GPUPool.db_url / GPUHUB_POOL_DB_URL")
            return
        try:
            url = make_url(pool.db_url)
            if url.get_backend_name() == "sqlite" and url.database and not os.path.exists(url.database):
                self.add("ledger", WARN, f"no ledger yet at {url.database}: the hub makes it at its first start")
                return
            known = [s for s in pool.gpus() if self.inventory and s.gpu.host == self.inventory.host]
            pool.check_host_identity()
        except HostConflict as e:
            head, _, advice = str(e).partition("If this machine")
            self.add("ledger", FAIL, f"{pool.safe_url}: another host name holds these GPUs ({head.strip()})",
                     f"if this machine{advice}" if advice else "see gpu-pool rehome")
            return
        except PoolUnavailable as e:
            self.add("ledger", FAIL, str(e), "start the database, or fix c.GPUPool.db_url / GPUHUB_POOL_DB_URL "
                     "(host, port, user, password)")
            return
        except PoolError as e:
            self.add("ledger", FAIL, f"{pool.safe_url}: {e}", "see the message; gpu-pool status shows the ledger")
            return
        finally:
            pool.close()
        host = self.inventory.host if self.inventory else "?"
        self.add("ledger", OK, f"{pool.safe_url} answers; it lists {len(known)} GPU(s) of host {host}"
                 + ("" if known else " (the hub records them at its next start)"))

    def check_data_dir(self) -> None:
        self.results.append(data_dir_result(self.target.data_dir, self.target.hub_user))


def data_dir_of(config: Config, fallback: Path) -> Path:
    """The hub's data directory: where its cookie secret (or its SQLite database) lives."""
    hub = config.JupyterHub
    if hub.get("cookie_secret_file", None):
        return Path(hub.cookie_secret_file).resolve().parent
    db_url = hub.get("db_url", None)
    url = make_url(db_url) if db_url else None
    if url is not None and url.get_backend_name() == "sqlite" and url.database:
        return Path(url.database).resolve().parent
    return fallback.resolve()


def target_from_env(hub_user: str, env=None, env_file_problems=()) -> Target:
    """GPUHUB_* settings, read as hub_config/jupyterhub_config.py reads them (outside the hub that only sets values)."""
    from ..settings import apply_settings, load_settings

    env = os.environ if env is None else env
    settings = load_settings(env)
    config = Config()
    with contextlib.redirect_stderr(io.StringIO()):  # the hub's start-up notes are not the doctor's
        apply_settings(config, settings)
    notes = [(f"line {number} ({key}) of the settings file: {problem}; systemd and a shell read it "
              "differently", "see the rule at the top of hub_config/examples/production.env")
             for number, key, problem in env_file_problems]
    if not env.get("GPUHUB_DATA_DIR", "").strip():
        notes.append((f"GPUHUB_DATA_DIR is not set: checking the defaults, with {settings.data_dir} as the "
                      "data directory", "read the hub's settings: gpu-pool --env-file "
                      "/etc/jupyterhub-gpu/gpuhub.env doctor"))
    return Target(config, settings.data_dir, hub_user, notes)


