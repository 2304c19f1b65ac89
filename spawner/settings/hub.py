"""The hub's deployment settings: GPUHUB_* for ports, data, Docker, GPUs, images, culling.

Settings is everything jupyterhub_config.py needs, read and checked in one go by
load_settings (the directory login's part comes from directory.py).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from ..engines import ENGINE_NAMES, engine
from ..pool import ENV_DB_URL, LEDGER_FILE, ledger_env
from ..ssh.gateway_settings import SSHGateway
from .directory import DirectorySettings, check_crypt_key, load_directory_settings
from .parsing import SettingsError, env_bool, env_choice, env_float, env_int, env_key_values
from .secret_files import private_file, secret_setting, with_secret_files

DEFAULT_CPU_IMAGE = "gpuhub/notebook-mkl:latest"
DEFAULT_GPU_IMAGE = "gpuhub/notebook-cuda:latest"


@dataclass(frozen=True)
class Settings:
    bind_url: str = "http://127.0.0.1:8000"
    ssl_cert: str = ""
    ssl_key: str = ""
    # GPUHUB_HUB_PORT: c.JupyterHub.hub_port; None (unset): JupyterHub's own default stands.
    hub_port: int | None = None
    proxy_api_port: int = 8001
    data_dir: Path = Path(".")
    docker_network: str = "gpuhub"
    container_prefix: str = "gpuhub"
    home_volume: str = ""  # GPUHUB_HOME_VOLUME; empty: the spawner's own (home_volume_name)
    inventory: str = "nvml"
    spawner: str = "docker"  # GPUHUB_SPAWNER: docker (one host) or swarm (gpu-swarm)
    hub_connect_ip: str = ""  # GPUHUB_HUB_CONNECT_IP: the hub's address on the Swarm overlay
    swarm_home_options: dict = field(default_factory=dict)  # GPUHUB_SWARM_HOME_OPTIONS (JSON)
    swarm_homes_root_options: dict = field(default_factory=dict)  # GPUHUB_SWARM_HOMES_ROOT_OPTIONS
    swarm_cpu_constraints: tuple[str, ...] = ()  # GPUHUB_SWARM_CPU_CONSTRAINTS (comma-separated)
    swarm_node_labels: dict = field(default_factory=dict)  # GPUHUB_SWARM_NODE_LABELS (key=value,...)
    gpu_host: str = ""
    # GPUHUB_SIMULATED_GPUS, GPUHUB_SIMULATED_CUDA_VERSION: c.SimulatedInventory.count and
    # .cuda_version; None (unset): the inventory's own defaults stand.
    simulated_gpus: int | None = None
    simulated_cuda_version: str | None = None
    simulated_utilization_file: str = ""
    pool_db_url: str = ""
    cpu_image: str = DEFAULT_CPU_IMAGE
    gpu_image: str = DEFAULT_GPU_IMAGE
    profiles: list | None = None
    authenticator: str = "ldap"
    dummy_password: str = ""
    admin_users: tuple[str, ...] = ()
    pool_exec_users: tuple[str, ...] = ()  # GPUHUB_POOL_EXEC_USERS: may run action scripts
    lease_wait_timeout: float | None = None  # GPUHUB_LEASE_WAIT_TIMEOUT: c.GPUDockerSpawner.lease_wait_timeout
    max_gpus_per_user: int | None = None
    gpu_hour_budget: float | None = None  # GPUHUB_GPU_HOUR_BUDGET: GPU-hours per user per 7 days
    cleanup_servers: bool | None = None  # GPUHUB_CLEANUP_SERVERS: c.JupyterHub.cleanup_servers; unset: its default
    cookie_secret_file: str = ""  # GPUHUB_COOKIE_SECRET_FILE: c.JupyterHub.cookie_secret_file (a Docker secret)
    # From JUPYTERHUB_CRYPT_KEY_FILE only (JupyterHub reads JUPYTERHUB_CRYPT_KEY itself): c.CryptKeeper.keys.
    crypt_keys: tuple[str, ...] = field(default=(), repr=False)
    cull: bool = True
    # GPUHUB_CULL_TIMEOUT_CPU, _GPU, _GPU_CONTENDED, GPUHUB_CULL_EVERY, GPUHUB_GPU_IDLE_PERCENT and
    # GPUHUB_GPU_IDLE_MINUTES: each sets one c.GPUIdleCuller option (settings/culler.py OPTIONS);
    # None (unset): the culler's own default stands.
    cull_timeout_cpu: int | None = None
    cull_timeout_gpu: int | None = None
    cull_timeout_gpu_contended: int | None = None
    cull_every: int | None = None
    gpu_idle_percent: float | None = None
    gpu_idle_minutes: float | None = None
    cull_keep_busy: str = "extension"
    activity_interval: int = 0
    pool_page: bool = True
    pool_page_port: int = 8091
    pool_page_show_holders: bool = False
    jobs: bool = True
    # GPUHUB_JOB_MAX_SECONDS, GPUHUB_JOB_LOG_MAX_BYTES; None (unset): JobSettings's own defaults.
    job_max_seconds: int | None = None
    job_log_max_bytes: int | None = None
    ssh: bool = False  # GPUHUB_SSH: the SSH gateway (gpu-ssh service); it opens a port, so off by default
    ssh_page_port: int = 8092  # GPUHUB_SSH_PAGE_PORT: the service's web page (keys), behind the proxy
    ssh_port: int = SSHGateway.port.default_value  # GPUHUB_SSH_PORT: c.SSHGateway.port (its default, read there)
    ssh_address: str = ""  # GPUHUB_SSH_ADDRESS: sets c.SSHGateway.address (its default when unset)
    directory: DirectorySettings | None = None
    extra: dict = field(default_factory=dict)


def _keep_busy(env: Mapping[str, str]) -> str:
    """GPUHUB_CULL_KEEP_BUSY: "extension" (true) or "off" (false); "wrapper" is deprecated."""
    raw = env.get("GPUHUB_CULL_KEEP_BUSY", "").strip().lower()
    if raw in ("", "1", "true", "yes", "on", "extension"):
        return "extension"
    if raw == "wrapper":
        # It started jupyterhub-singleuser through a `python -c` patch of a private method.
        print("WARNING: GPUHUB_CULL_KEEP_BUSY=wrapper is deprecated and now means true: busy kernels "
              "count as activity through the images' gpuhub_activity extension only; `gpu-pool doctor` "
              "names a profile image without it.", file=sys.stderr)
        return "extension"
    if raw in ("0", "false", "no", "off"):
        return "off"
    raise SettingsError(f"GPUHUB_CULL_KEEP_BUSY={raw!r} must be true (the images' extension) or false")


def _readable_file(env: Mapping[str, str], name: str) -> str:
    """The path in `name`, checked to be a file the hub can read ("" when unset)."""
    path = env.get(name, "").strip()
    if not path:
        return ""
    try:
        with open(path, "rb") as f:
            f.read(1)
    except OSError as exc:
        raise SettingsError(f"{name}={path!r} cannot be read: {exc.strerror}") from None
    return str(Path(path).resolve())


def _tls_files(env: Mapping[str, str], bind_url: str) -> tuple[str, str]:
    """GPUHUB_SSL_CERT and GPUHUB_SSL_KEY: both or neither, readable, and
    GPUHUB_BIND_URL's scheme agreeing (https with them, http without)."""
    cert = _readable_file(env, "GPUHUB_SSL_CERT")
    key = _readable_file(env, "GPUHUB_SSL_KEY")
    if bool(cert) != bool(key):
        given, missing = ("GPUHUB_SSL_CERT", "GPUHUB_SSL_KEY") if cert else ("GPUHUB_SSL_KEY", "GPUHUB_SSL_CERT")
        raise SettingsError(f"{given} is set but {missing} is not: HTTPS needs both the certificate "
                            "and its private key")
    scheme = urlparse(bind_url).scheme
    if cert and scheme != "https":
        raise SettingsError(f"GPUHUB_BIND_URL={bind_url!r} must start with https:// when "
                            "GPUHUB_SSL_CERT and GPUHUB_SSL_KEY are set")
    if not cert and scheme == "https":
        raise SettingsError(f"GPUHUB_BIND_URL={bind_url!r} is https but GPUHUB_SSL_CERT and "
                            "GPUHUB_SSL_KEY are not set: set them, or use http:// behind a "
                            "reverse proxy that terminates TLS")
    return cert, key


def _json_object(env: Mapping[str, str], name: str) -> dict:
    text = env.get(name, "").strip()
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise SettingsError(f"{name} is not JSON: {exc}") from None
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise SettingsError(f"{name} must be a JSON object of strings (Docker local-driver options), "
                            'like {"type": "nfs", "o": "addr=10.0.0.5,rw", "device": ":/export/homes/{username}"}')
    return value


def _swarm_settings(env: Mapping[str, str], spawner: str, data_dir: Path) -> dict:
    """GPUHUB_HUB_CONNECT_IP and GPUHUB_SWARM_*; with the swarm spawner, a PostgreSQL ledger."""
    values = dict(
        hub_connect_ip=env.get("GPUHUB_HUB_CONNECT_IP", "").strip(),
        swarm_home_options=_json_object(env, "GPUHUB_SWARM_HOME_OPTIONS"),
        swarm_homes_root_options=_json_object(env, "GPUHUB_SWARM_HOMES_ROOT_OPTIONS"),
        swarm_cpu_constraints=tuple(c.strip() for c in env.get("GPUHUB_SWARM_CPU_CONSTRAINTS", "").split(",")
                                    if c.strip()),
        swarm_node_labels=env_key_values(env, "GPUHUB_SWARM_NODE_LABELS"),
    )
    if engine(spawner).spans_nodes:
        if not ledger_env(ENV_DB_URL, env).startswith("postgresql"):
            raise SettingsError("GPUHUB_SPAWNER=swarm lends the GPUs of several hosts from one ledger, "
                                "which must be PostgreSQL: set GPUHUB_POOL_DB_URL=postgresql+psycopg://... "
                                "(an SQLite ledger lives on one machine)")
        if not values["hub_connect_ip"]:
            raise SettingsError("GPUHUB_SPAWNER=swarm needs GPUHUB_HUB_CONNECT_IP: the hub container's "
                                "address on the overlay network (GPUHUB_DOCKER_NETWORK), where servers "
                                "on every node reach the hub")
    return values


def _jobs_wanted(env: Mapping[str, str], spawner: str) -> bool:
    """GPUHUB_JOBS: on by default, on one host (the hub's Docker) and on Swarm (any GPU node)."""
    return env_bool(env, "GPUHUB_JOBS", True)


def data_dir_setting(env: Mapping[str, str]) -> Path:
    """GPUHUB_DATA_DIR, made absolute; unset, the current directory."""
    return Path(env.get("GPUHUB_DATA_DIR", "").strip() or ".").resolve()


def ledger_url(env: Mapping[str, str]) -> str:
    """The one rule for where the GPU ledger is, for the hub and every command beside it:
    GPUHUB_POOL_DB_URL (or the file GPUHUB_POOL_DB_URL_FILE names, a Docker secret), else the
    SQLite file gpu-pool.sqlite in GPUHUB_DATA_DIR."""
    from_file = secret_setting(env, ENV_DB_URL)
    return from_file or ledger_env(ENV_DB_URL, env) or f"sqlite:///{data_dir_setting(env) / LEDGER_FILE}"


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    given = os.environ if env is None else env
    # Secrets given as files (Docker secrets: GPUHUB_POOL_DB_URL_FILE, JUPYTERHUB_CRYPT_KEY_FILE).
    env = with_secret_files(given)
    data_dir = data_dir_setting(env)

    bind_url = env.get("GPUHUB_BIND_URL", "").strip() or Settings.bind_url
    host = urlparse(bind_url).hostname
    if not host or urlparse(bind_url).scheme not in ("http", "https"):
        raise SettingsError(f"GPUHUB_BIND_URL={bind_url!r} must be a URL like http://127.0.0.1:8000")
    ssl_cert, ssl_key = _tls_files(env, bind_url)

    spawner = env_choice(env, "GPUHUB_SPAWNER", Settings.spawner, ENGINE_NAMES)
    inventory = env_choice(env, "GPUHUB_INVENTORY", engine(spawner).inventory_kind or "nvml",
                           ("nvml", "simulated", "static", "swarm"))
    swarm = _swarm_settings(env, spawner, data_dir)
    gpu_host = env.get("GPUHUB_GPU_HOST", "").strip()
    if any(ord(ch) < 32 for ch in gpu_host) or len(gpu_host) > 255:
        raise SettingsError(f"GPUHUB_GPU_HOST={gpu_host!r} must be a host name (at most 255 characters)")
    authenticator = env_choice(env, "GPUHUB_AUTHENTICATOR", "ldap", ("ldap", "dummy"))
    dummy_password = env.get("GPUHUB_DUMMY_PASSWORD", "")
    if authenticator == "dummy" and not dummy_password:
        raise SettingsError(
            "GPUHUB_AUTHENTICATOR=dummy needs GPUHUB_DUMMY_PASSWORD (a shared password; for tests only)")
    crypt_keys: tuple[str, ...] = ()
    if given.get("JUPYTERHUB_CRYPT_KEY_FILE", "").strip():
        check_crypt_key(env)
        crypt_keys = tuple(k.strip() for k in env["JUPYTERHUB_CRYPT_KEY"].split(";") if k.strip())
    directory = None
    if authenticator == "ldap":
        directory = load_directory_settings(env)
        if directory is not None:
            check_crypt_key(env)
    elif env.get("GPUHUB_DIRECTORY", "").strip():
        raise SettingsError(
            f"GPUHUB_DIRECTORY is set but GPUHUB_AUTHENTICATOR={authenticator}: the directory is "
            "only used with GPUHUB_AUTHENTICATOR=ldap")

    profiles = None
    profiles_file = env.get("GPUHUB_PROFILES_FILE", "").strip()
    if profiles_file:
        try:
            profiles = json.loads(Path(profiles_file).read_text())
        except (OSError, ValueError) as exc:
            raise SettingsError(f"GPUHUB_PROFILES_FILE={profiles_file!r} cannot be read as JSON: {exc}") from None
        if not isinstance(profiles, list):
            raise SettingsError("GPUHUB_PROFILES_FILE must hold a JSON list of profiles")

    cull_cpu = env_int(env, "GPUHUB_CULL_TIMEOUT_CPU", None, minimum=1)  # type: ignore[arg-type]
    cull_gpu = env_int(env, "GPUHUB_CULL_TIMEOUT_GPU", None, minimum=1)  # type: ignore[arg-type]
    # Unset: the culler's own default (on where NVML can read utilisation, GPUIdleCuller's rule).
    gpu_idle_percent = env_float(env, "GPUHUB_GPU_IDLE_PERCENT", None)  # type: ignore[arg-type]
    if gpu_idle_percent is not None and not 0 <= gpu_idle_percent <= 100:
        raise SettingsError(f"GPUHUB_GPU_IDLE_PERCENT={gpu_idle_percent} must be between 0 and 100")

    given_hub_port = env_int(env, "GPUHUB_HUB_PORT", None, minimum=1)  # type: ignore[arg-type]
    hub_port = given_hub_port or standing_default("hub_port")
    proxy_api_port = env_int(env, "GPUHUB_PROXY_API_PORT", Settings.proxy_api_port, minimum=1)
    public_port = urlparse(bind_url).port or (443 if bind_url.startswith("https") else 80)
    if len({hub_port, proxy_api_port, public_port}) < 3:
        raise SettingsError(
            f"GPUHUB_HUB_PORT ({hub_port}), GPUHUB_PROXY_API_PORT ({proxy_api_port}) and the port of "
            f"GPUHUB_BIND_URL ({public_port}) must all differ")
    pool_page = env_bool(env, "GPUHUB_POOL_PAGE", True)
    pool_page_port = env_int(env, "GPUHUB_POOL_PAGE_PORT", Settings.pool_page_port, minimum=1)
    if pool_page and pool_page_port in (hub_port, proxy_api_port, public_port):
        raise SettingsError(
            f"GPUHUB_POOL_PAGE_PORT ({pool_page_port}) must differ from the hub's, the proxy API's "
            "and GPUHUB_BIND_URL's ports")

    ssh = env_bool(env, "GPUHUB_SSH", False)
    ssh_page_port = env_int(env, "GPUHUB_SSH_PAGE_PORT", Settings.ssh_page_port, minimum=1)
    if ssh and ssh_page_port in (hub_port, proxy_api_port, public_port, pool_page_port):
        raise SettingsError(f"GPUHUB_SSH_PAGE_PORT ({ssh_page_port}) must differ from the hub's, the proxy "
                            "API's, the pool page's and GPUHUB_BIND_URL's ports")
    ssh_port = env_int(env, "GPUHUB_SSH_PORT", Settings.ssh_port, minimum=1)
    if ssh and ssh_port in (hub_port, proxy_api_port, public_port, pool_page_port, ssh_page_port):
        raise SettingsError(f"GPUHUB_SSH_PORT ({ssh_port}) must differ from the hub's other ports")

    return Settings(
        bind_url=bind_url,
        ssl_cert=ssl_cert,
        ssl_key=ssl_key,
        hub_port=given_hub_port,
        proxy_api_port=proxy_api_port,
        data_dir=data_dir,
        docker_network=env.get("GPUHUB_DOCKER_NETWORK", "").strip() or Settings.docker_network,
        container_prefix=env.get("GPUHUB_CONTAINER_PREFIX", "").strip() or Settings.container_prefix,
        home_volume=env.get("GPUHUB_HOME_VOLUME", "").strip(),
        inventory=inventory,
        spawner=spawner,
        **swarm,
        gpu_host=gpu_host,
        simulated_gpus=env_int(env, "GPUHUB_SIMULATED_GPUS", None, minimum=0),  # type: ignore[arg-type]
        simulated_cuda_version=env.get("GPUHUB_SIMULATED_CUDA_VERSION", "").strip() or None,
        simulated_utilization_file=env.get("GPUHUB_SIMULATED_UTILIZATION_FILE", "").strip(),
        pool_db_url=ledger_url(env),
        cpu_image=env.get("GPUHUB_CPU_IMAGE", "").strip() or DEFAULT_CPU_IMAGE,
        gpu_image=env.get("GPUHUB_GPU_IMAGE", "").strip() or DEFAULT_GPU_IMAGE,
        profiles=profiles,
        authenticator=authenticator,
        dummy_password=dummy_password,
        admin_users=tuple(u.strip() for u in env.get("GPUHUB_ADMIN_USERS", "").split(",") if u.strip()),
        pool_exec_users=tuple(u.strip() for u in env.get("GPUHUB_POOL_EXEC_USERS", "").split(",") if u.strip()),
        lease_wait_timeout=env_float(env, "GPUHUB_LEASE_WAIT_TIMEOUT", None),  # type: ignore[arg-type]
        max_gpus_per_user=(env_int(env, "GPUHUB_MAX_GPUS_PER_USER", 0, minimum=0)
                           if env.get("GPUHUB_MAX_GPUS_PER_USER", "").strip() else None),
        gpu_hour_budget=(env_float(env, "GPUHUB_GPU_HOUR_BUDGET", 0.0, minimum=0.0)
                         if env.get("GPUHUB_GPU_HOUR_BUDGET", "").strip() else None),
        cleanup_servers=(env_bool(env, "GPUHUB_CLEANUP_SERVERS", True)
                         if env.get("GPUHUB_CLEANUP_SERVERS", "").strip() else None),
        cookie_secret_file=private_file(env, "GPUHUB_COOKIE_SECRET_FILE"),
        crypt_keys=crypt_keys,
        cull=env_bool(env, "GPUHUB_CULL", True),
        cull_timeout_cpu=cull_cpu,
        cull_timeout_gpu=cull_gpu,
        cull_timeout_gpu_contended=env_int(env, "GPUHUB_CULL_TIMEOUT_GPU_CONTENDED",
                                           None, minimum=0),  # type: ignore[arg-type]
        cull_every=env_int(env, "GPUHUB_CULL_EVERY", None, minimum=1),  # type: ignore[arg-type]
        gpu_idle_percent=gpu_idle_percent,
        gpu_idle_minutes=env_float(env, "GPUHUB_GPU_IDLE_MINUTES", None),  # type: ignore[arg-type]
        cull_keep_busy=_keep_busy(env),
        activity_interval=env_int(env, "GPUHUB_ACTIVITY_INTERVAL", 0, minimum=0),
        pool_page=pool_page,
        pool_page_port=pool_page_port,
        pool_page_show_holders=env_bool(env, "GPUHUB_POOL_PAGE_SHOW_HOLDERS", False),
        # Batch jobs run in the gpu-pool service: without it there are none.
        jobs=pool_page and _jobs_wanted(env, spawner),
        job_max_seconds=env_int(env, "GPUHUB_JOB_MAX_SECONDS", None, minimum=1),  # type: ignore[arg-type]
        job_log_max_bytes=env_int(env, "GPUHUB_JOB_LOG_MAX_BYTES", None, minimum=1024),  # type: ignore[arg-type]
        ssh=ssh,
        ssh_page_port=ssh_page_port,
        ssh_port=ssh_port,
        ssh_address=env.get("GPUHUB_SSH_ADDRESS", "").strip(),
        directory=directory,
    )


# The Settings fields whose None (their variable unset) writes nothing: (module, class, option)
# whose own default then stands.
STANDING_DEFAULTS = {
    "hub_port": ("jupyterhub.app", "JupyterHub", "hub_port"),
    "lease_wait_timeout": ("spawner.lending", "GPULendingSpawner", "lease_wait_timeout"),
    "simulated_gpus": ("spawner.inventory.machine", "SimulatedInventory", "count"),
    "simulated_cuda_version": ("spawner.inventory.machine", "SimulatedInventory", "cuda_version"),
    "job_max_seconds": ("spawner.jobs.runner_settings", "JobSettings", "max_seconds"),
    "job_log_max_bytes": ("spawner.jobs.runner_settings", "JobSettings", "log_max_bytes"),
}


def standing_default(name: str):
    """What Settings field `name` amounts to when its variable is unset: its own default, or,
    for a field that then writes nothing, the default of the option it would set."""
    import importlib
    from dataclasses import fields

    if name not in STANDING_DEFAULTS:
        return next(f.default for f in fields(Settings) if f.name == name)
    module, cls, option = STANDING_DEFAULTS[name]
    owner = getattr(importlib.import_module(module), cls)
    traits = owner.class_traits() if hasattr(owner, "class_traits") else None
    return traits[option].default_value if traits is not None else getattr(owner, option)


def hub_port(settings: Settings) -> int:
    """The port the hub's API listens on: GPUHUB_HUB_PORT, else JupyterHub's default."""
    return settings.hub_port or standing_default("hub_port")


def default_profiles(settings: Settings) -> list[dict]:
    return [
        {
            "slug": "tf-cpu",
            "display_name": "TensorFlow CPU (MKL/oneDNN)",
            "description": "CPU TensorFlow with the oneDNN (MKL) optimisations on. No GPU.",
            "image": settings.cpu_image,
            "gpus": 0,
            "cpu_limit": 2.0,
            "mem_limit": "4G",
        },
        {
            "slug": "tf-gpu-1",
            "display_name": "TensorFlow + 1 GPU",
            "description": "TensorFlow with CUDA on one NVIDIA GPU lent to you alone.",
            "image": settings.gpu_image,
            "gpus": 1,
            "cpu_limit": 2.0,
            "mem_limit": "8G",
        },
        {
            "slug": "tf-gpu-2",
            "display_name": "TensorFlow + 2 GPUs",
            "description": "TensorFlow with CUDA on two NVIDIA GPUs, close together on the host.",
            "image": settings.gpu_image,
            "gpus": 2,
            "cpu_limit": 2.0,
            "mem_limit": "16G",
        },
    ]
