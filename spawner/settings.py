"""Deployment settings for hub_config/jupyterhub_config.py, from GPUHUB_* variables.

One place reads the environment and checks it; a missing or contradictory
setting raises SettingsError naming the variable, and the hub stops at start
with that message instead of failing later in a user's spawn.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping
from urllib.parse import urlparse

DEFAULT_CPU_IMAGE = "gpuhub/notebook-mkl:latest"
DEFAULT_GPU_IMAGE = "gpuhub/notebook-cuda:latest"
# With NVML (real GPUs), a GPU server whose GPUs all stay under this
# utilisation for GPUHUB_GPU_IDLE_MINUTES (30) is culled even if it shows
# activity: a kernel blocked on a prompt, a tab left open.
DEFAULT_GPU_IDLE_PERCENT = 5.0


class SettingsError(ValueError):
    """A deployment setting is missing or wrong; the message names it."""


@dataclass(frozen=True)
class Settings:
    bind_url: str = "http://127.0.0.1:8000"
    hub_port: int = 8081
    proxy_api_port: int = 8001
    data_dir: Path = Path(".")
    docker_network: str = "gpuhub"
    container_prefix: str = "gpuhub"
    home_volume: str = "gpuhub-home-{username}"
    inventory: str = "nvml"
    simulated_gpus: int = 4
    simulated_cuda_version: str = "12.4"
    simulated_utilization_file: str = ""
    pool_db_url: str = ""
    cpu_image: str = DEFAULT_CPU_IMAGE
    gpu_image: str = DEFAULT_GPU_IMAGE
    profiles: list | None = None
    authenticator: str = "ldap"
    dummy_password: str = ""
    admin_users: tuple[str, ...] = ()
    lease_wait_timeout: float = 300.0
    max_gpus_per_user: int | None = None
    cleanup_servers: bool = True
    cull: bool = True
    cull_timeout_cpu: int = 3600
    cull_timeout_gpu: int = 900
    cull_every: int = 60
    gpu_idle_percent: float = 0.0
    gpu_idle_minutes: float = 30.0
    cull_keep_busy: str = "extension"
    activity_interval: int = 0
    directory: "DirectorySettings | None" = None
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class DirectorySettings:
    """Where the directory login (GPUHUB_AUTHENTICATOR=ldap) looks users up.

    `bind_password` is kept out of repr(), so printing the settings never
    shows it.
    """

    kind: str  # "openldap" or "active_directory"
    server: str
    port: int
    tls: str  # "ldaps", "starttls" or "plain"
    ca_file: str = ""
    tls_server_name: str = ""
    bind_dn: str = ""
    bind_password: str = field(default="", repr=False)
    user_base: str = ""
    group_base: str = ""
    allowed_groups: tuple[str, ...] = ()
    admin_groups: tuple[str, ...] = ()
    allow_plaintext: bool = False

    def authenticator_config(self) -> dict:
        """Traits for spawner.auth.DirectoryAuthenticator."""
        strategy = {"ldaps": "on_connect", "starttls": "before_bind", "plain": "insecure"}[self.tls]
        cfg: dict = {
            "directory": self.kind,
            "server_address": self.server,
            "server_port": self.port,
            "tls_strategy": strategy,
            "allow_plaintext": self.tls == "plain",
            "lookup_dn": True,
            "user_search_base": self.user_base,
            "group_search_base": self.group_base or self.user_base,
            "allowed_groups": list(self.allowed_groups),
            "admin_groups": list(self.admin_groups),
        }
        if self.ca_file:
            cfg["tls_ca_file"] = self.ca_file
        if self.tls_server_name:
            cfg["tls_kwargs"] = {"valid_names": [self.tls_server_name]}
        if self.bind_dn:
            cfg["lookup_dn_search_user"] = self.bind_dn
            cfg["lookup_dn_search_password"] = self.bind_password
        return cfg


def _int(env: Mapping[str, str], name: str, default: int, minimum: int | None = None) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not an integer") from None
    if minimum is not None and value < minimum:
        raise SettingsError(f"{name}={value} must be at least {minimum}")
    return value


def _float(env: Mapping[str, str], name: str, default: float, minimum: float = 0.0) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a number") from None
    if value < minimum:
        raise SettingsError(f"{name}={value} must be at least {minimum}")
    return value


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise SettingsError(f"{name}={raw!r} must be true or false")


def _keep_busy(env: Mapping[str, str]) -> str:
    """GPUHUB_CULL_KEEP_BUSY: "extension" (true), "wrapper" or "off" (false)."""
    raw = env.get("GPUHUB_CULL_KEEP_BUSY", "").strip().lower()
    if raw in ("", "1", "true", "yes", "on", "extension"):
        return "extension"
    if raw == "wrapper":
        return "wrapper"
    if raw in ("0", "false", "no", "off"):
        return "off"
    raise SettingsError(f"GPUHUB_CULL_KEEP_BUSY={raw!r} must be true (the images' extension), "
                        "wrapper (images without it) or false")


def _choice(env: Mapping[str, str], name: str, default: str, choices: tuple[str, ...]) -> str:
    raw = env.get(name, "").strip().lower() or default
    if raw not in choices:
        raise SettingsError(f"{name}={raw!r} must be one of: {', '.join(choices)}")
    return raw


def _list(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in env.get(name, "").split(",") if item.strip())


DIRECTORY_KINDS = ("openldap", "active_directory")
TLS_MODES = ("ldaps", "starttls", "plain")
# The variables that only mean something with GPUHUB_DIRECTORY set.
DIRECTORY_VARS = (
    "GPUHUB_DIRECTORY_SERVER", "GPUHUB_DIRECTORY_PORT", "GPUHUB_DIRECTORY_TLS",
    "GPUHUB_DIRECTORY_CA_FILE", "GPUHUB_DIRECTORY_TLS_SERVER_NAME",
    "GPUHUB_DIRECTORY_ALLOW_PLAINTEXT", "GPUHUB_DIRECTORY_BIND_DN",
    "GPUHUB_DIRECTORY_BIND_PASSWORD", "GPUHUB_DIRECTORY_BIND_PASSWORD_FILE",
    "GPUHUB_DIRECTORY_USER_BASE", "GPUHUB_DIRECTORY_GROUP_BASE",
    "GPUHUB_DIRECTORY_ALLOWED_GROUPS", "GPUHUB_DIRECTORY_ADMIN_GROUPS",
)


def _bind_password(env: Mapping[str, str]) -> str:
    """GPUHUB_DIRECTORY_BIND_PASSWORD, or the contents of GPUHUB_DIRECTORY_BIND_PASSWORD_FILE.

    No message here ever contains the password itself.
    """
    inline = env.get("GPUHUB_DIRECTORY_BIND_PASSWORD", "")
    path = env.get("GPUHUB_DIRECTORY_BIND_PASSWORD_FILE", "").strip()
    if inline and path:
        raise SettingsError(
            "GPUHUB_DIRECTORY_BIND_PASSWORD and GPUHUB_DIRECTORY_BIND_PASSWORD_FILE are both set; "
            "set only one (the file is the safer choice)")
    if not path:
        return inline
    try:
        # One trailing newline is what `echo secret > file` leaves; it is not
        # part of the password.
        password = Path(path).read_text().removesuffix("\n").removesuffix("\r")
    except OSError as exc:
        raise SettingsError(
            f"GPUHUB_DIRECTORY_BIND_PASSWORD_FILE={path!r} cannot be read: {exc.strerror}") from None
    if not password:
        raise SettingsError(f"GPUHUB_DIRECTORY_BIND_PASSWORD_FILE={path!r} is empty")
    return password


def _check_crypt_key(env: Mapping[str, str]) -> None:
    """The directory login keeps uid/gid and groups in auth_state, which
    JupyterHub stores encrypted with JUPYTERHUB_CRYPT_KEY (one key, or several
    separated by ';' while rotating).  Checked here so the hub stops with a
    message that says what to do, before anything starts."""
    raw = env.get("JUPYTERHUB_CRYPT_KEY", "").strip()
    if not raw:
        raise SettingsError(
            "JUPYTERHUB_CRYPT_KEY is not set: the directory login stores each user's uid/gid and "
            "groups encrypted with it. Create one with `openssl rand -hex 32` and keep it "
            "(a new key makes the stored state unreadable; users then log in again)")
    for i, key in enumerate(k.strip() for k in raw.split(";") if k.strip()):
        try:
            decoded = binascii.a2b_hex(key)
        except (binascii.Error, ValueError):
            try:
                decoded = base64.urlsafe_b64decode(key)
            except (binascii.Error, ValueError):
                decoded = b""
        if len(decoded) != 32:
            # Never echo the key.
            raise SettingsError(
                f"JUPYTERHUB_CRYPT_KEY: key {i + 1} is not 32 bytes of hex or base64 "
                "(create one with `openssl rand -hex 32`)")


def load_directory_settings(env: Mapping[str, str]) -> DirectorySettings | None:
    """The GPUHUB_DIRECTORY_* settings; None when GPUHUB_DIRECTORY is unset.

    Unset means the directory is configured in a config file loaded after
    jupyterhub_config.py (c.DirectoryAuthenticator..., see hub_config/examples/).
    """
    raw_kind = env.get("GPUHUB_DIRECTORY", "").strip().lower()
    if not raw_kind:
        stray = [name for name in DIRECTORY_VARS if env.get(name, "").strip()]
        if stray:
            raise SettingsError(
                f"{stray[0]} is set but GPUHUB_DIRECTORY is not: set GPUHUB_DIRECTORY to "
                f"{' or '.join(DIRECTORY_KINDS)}")
        return None
    kind = _choice(env, "GPUHUB_DIRECTORY", "", DIRECTORY_KINDS)

    server = env.get("GPUHUB_DIRECTORY_SERVER", "").strip()
    if not server:
        raise SettingsError(
            "GPUHUB_DIRECTORY_SERVER is not set: the directory's host name, e.g. ldap.example.com")
    if "://" in server or "/" in server:
        raise SettingsError(
            f"GPUHUB_DIRECTORY_SERVER={server!r} must be a host name only; "
            "the port goes in GPUHUB_DIRECTORY_PORT and TLS in GPUHUB_DIRECTORY_TLS")

    # Active Directory refuses simple binds without TLS; LDAPS is its usual
    # port.  OpenLDAP is usually StartTLS on 389.
    tls = _choice(env, "GPUHUB_DIRECTORY_TLS", "ldaps" if kind == "active_directory" else "starttls",
                  TLS_MODES)
    allow_plaintext = _bool(env, "GPUHUB_DIRECTORY_ALLOW_PLAINTEXT", False)
    ca_file = env.get("GPUHUB_DIRECTORY_CA_FILE", "").strip()
    if tls == "plain":
        if not allow_plaintext:
            raise SettingsError(
                "GPUHUB_DIRECTORY_TLS=plain sends passwords unencrypted: use ldaps or starttls, "
                "or also set GPUHUB_DIRECTORY_ALLOW_PLAINTEXT=true if that is really intended")
        if ca_file:
            raise SettingsError(
                "GPUHUB_DIRECTORY_CA_FILE is set but GPUHUB_DIRECTORY_TLS=plain uses no TLS")
    elif allow_plaintext:
        raise SettingsError(
            f"GPUHUB_DIRECTORY_ALLOW_PLAINTEXT=true contradicts GPUHUB_DIRECTORY_TLS={tls}; "
            "remove it")
    if ca_file and not os.access(ca_file, os.R_OK):
        raise SettingsError(f"GPUHUB_DIRECTORY_CA_FILE={ca_file!r} is not a readable file")
    port = _int(env, "GPUHUB_DIRECTORY_PORT", 636 if tls == "ldaps" else 389, minimum=1)
    if port > 65535:
        raise SettingsError(f"GPUHUB_DIRECTORY_PORT={port} is not a TCP port")

    bind_dn = env.get("GPUHUB_DIRECTORY_BIND_DN", "").strip()
    bind_password = _bind_password(env)
    if bind_dn and not bind_password:
        raise SettingsError(
            "GPUHUB_DIRECTORY_BIND_DN is set but neither GPUHUB_DIRECTORY_BIND_PASSWORD nor "
            "GPUHUB_DIRECTORY_BIND_PASSWORD_FILE is")
    if bind_password and not bind_dn:
        raise SettingsError(
            "a service account password is set but GPUHUB_DIRECTORY_BIND_DN (whose password "
            "it is) is not")
    if kind == "active_directory" and not bind_dn:
        raise SettingsError(
            "GPUHUB_DIRECTORY=active_directory needs GPUHUB_DIRECTORY_BIND_DN (a read-only "
            "service account): Active Directory does not answer anonymous searches")

    user_base = env.get("GPUHUB_DIRECTORY_USER_BASE", "").strip()
    if not user_base:
        raise SettingsError(
            "GPUHUB_DIRECTORY_USER_BASE is not set: where users are searched, "
            "e.g. ou=people,dc=example,dc=com")
    allowed = _list(env, "GPUHUB_DIRECTORY_ALLOWED_GROUPS")
    if not allowed:
        raise SettingsError(
            "GPUHUB_DIRECTORY_ALLOWED_GROUPS is empty: name the groups (names or DNs, comma "
            "separated) whose members may use the hub")
    return DirectorySettings(
        kind=kind,
        server=server,
        port=port,
        tls=tls,
        ca_file=ca_file,
        tls_server_name=env.get("GPUHUB_DIRECTORY_TLS_SERVER_NAME", "").strip(),
        bind_dn=bind_dn,
        bind_password=bind_password,
        user_base=user_base,
        group_base=env.get("GPUHUB_DIRECTORY_GROUP_BASE", "").strip() or user_base,
        allowed_groups=allowed,
        admin_groups=_list(env, "GPUHUB_DIRECTORY_ADMIN_GROUPS"),
        allow_plaintext=allow_plaintext,
    )


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    env = os.environ if env is None else env
    data_dir = Path(env.get("GPUHUB_DATA_DIR", "").strip() or ".").resolve()

    bind_url = env.get("GPUHUB_BIND_URL", "").strip() or Settings.bind_url
    host = urlparse(bind_url).hostname
    if not host or urlparse(bind_url).scheme not in ("http", "https"):
        raise SettingsError(f"GPUHUB_BIND_URL={bind_url!r} must be a URL like http://127.0.0.1:8000")

    inventory = _choice(env, "GPUHUB_INVENTORY", "nvml", ("nvml", "simulated", "static"))
    authenticator = _choice(env, "GPUHUB_AUTHENTICATOR", "ldap", ("ldap", "dummy"))
    dummy_password = env.get("GPUHUB_DUMMY_PASSWORD", "")
    if authenticator == "dummy" and not dummy_password:
        raise SettingsError(
            "GPUHUB_AUTHENTICATOR=dummy needs GPUHUB_DUMMY_PASSWORD (a shared password; for tests only)")
    directory = None
    if authenticator == "ldap":
        directory = load_directory_settings(env)
        if directory is not None:
            _check_crypt_key(env)
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

    cull_cpu = _int(env, "GPUHUB_CULL_TIMEOUT_CPU", Settings.cull_timeout_cpu, minimum=1)
    cull_gpu = _int(env, "GPUHUB_CULL_TIMEOUT_GPU", Settings.cull_timeout_gpu, minimum=1)
    # The GPU-utilisation rule is on by default where NVML can read it.
    gpu_idle_percent = _float(env, "GPUHUB_GPU_IDLE_PERCENT",
                              DEFAULT_GPU_IDLE_PERCENT if inventory == "nvml" else 0.0)
    if gpu_idle_percent > 100:
        raise SettingsError(f"GPUHUB_GPU_IDLE_PERCENT={gpu_idle_percent} must be between 0 and 100")

    hub_port = _int(env, "GPUHUB_HUB_PORT", Settings.hub_port, minimum=1)
    proxy_api_port = _int(env, "GPUHUB_PROXY_API_PORT", Settings.proxy_api_port, minimum=1)
    public_port = urlparse(bind_url).port or (443 if bind_url.startswith("https") else 80)
    if len({hub_port, proxy_api_port, public_port}) < 3:
        raise SettingsError(
            f"GPUHUB_HUB_PORT ({hub_port}), GPUHUB_PROXY_API_PORT ({proxy_api_port}) and the port of "
            f"GPUHUB_BIND_URL ({public_port}) must all differ")

    return Settings(
        bind_url=bind_url,
        hub_port=hub_port,
        proxy_api_port=proxy_api_port,
        data_dir=data_dir,
        docker_network=env.get("GPUHUB_DOCKER_NETWORK", "").strip() or Settings.docker_network,
        container_prefix=env.get("GPUHUB_CONTAINER_PREFIX", "").strip() or Settings.container_prefix,
        home_volume=env.get("GPUHUB_HOME_VOLUME", "").strip() or Settings.home_volume,
        inventory=inventory,
        simulated_gpus=_int(env, "GPUHUB_SIMULATED_GPUS", Settings.simulated_gpus, minimum=0),
        simulated_cuda_version=env.get("GPUHUB_SIMULATED_CUDA_VERSION", "").strip() or Settings.simulated_cuda_version,
        simulated_utilization_file=env.get("GPUHUB_SIMULATED_UTILIZATION_FILE", "").strip(),
        pool_db_url=env.get("GPUHUB_POOL_DB_URL", "").strip() or f"sqlite:///{data_dir / 'gpu-pool.sqlite'}",
        cpu_image=env.get("GPUHUB_CPU_IMAGE", "").strip() or DEFAULT_CPU_IMAGE,
        gpu_image=env.get("GPUHUB_GPU_IMAGE", "").strip() or DEFAULT_GPU_IMAGE,
        profiles=profiles,
        authenticator=authenticator,
        dummy_password=dummy_password,
        admin_users=tuple(u.strip() for u in env.get("GPUHUB_ADMIN_USERS", "").split(",") if u.strip()),
        lease_wait_timeout=_float(env, "GPUHUB_LEASE_WAIT_TIMEOUT", Settings.lease_wait_timeout),
        max_gpus_per_user=(_int(env, "GPUHUB_MAX_GPUS_PER_USER", 0, minimum=0)
                           if env.get("GPUHUB_MAX_GPUS_PER_USER", "").strip() else None),
        cleanup_servers=_bool(env, "GPUHUB_CLEANUP_SERVERS", True),
        cull=_bool(env, "GPUHUB_CULL", True),
        cull_timeout_cpu=cull_cpu,
        cull_timeout_gpu=cull_gpu,
        cull_every=_int(env, "GPUHUB_CULL_EVERY", Settings.cull_every, minimum=1),
        gpu_idle_percent=gpu_idle_percent,
        gpu_idle_minutes=_float(env, "GPUHUB_GPU_IDLE_MINUTES", Settings.gpu_idle_minutes),
        cull_keep_busy=_keep_busy(env),
        activity_interval=_int(env, "GPUHUB_ACTIVITY_INTERVAL", 0, minimum=0),
        directory=directory,
    )


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


def docker_network_gateway(name: str) -> str:
    """The gateway address of the Docker bridge `name`, made here if missing.

    The hub listens on that address only: containers on the bridge reach it,
    nothing outside this machine can.
    """
    import docker

    try:
        client = docker.from_env()
        try:
            network = client.networks.get(name)
        except docker.errors.NotFound:
            network = client.networks.create(name, driver="bridge")
        network.reload()
        return network.attrs["IPAM"]["Config"][0]["Gateway"]
    except Exception as exc:
        raise SettingsError(
            f"GPUHUB_DOCKER_NETWORK={name!r}: cannot reach Docker to find or create the bridge ({exc})"
        ) from None


def configure_directory(c, directory: DirectorySettings) -> None:
    """Set c.DirectoryAuthenticator from the GPUHUB_DIRECTORY_* settings."""
    for name, value in directory.authenticator_config().items():
        setattr(c.DirectoryAuthenticator, name, value)


def _inside_the_hub() -> bool:
    """True when this config is being loaded by a JupyterHub process."""
    try:
        from jupyterhub.app import JupyterHub
    except ImportError:
        return False
    return JupyterHub.initialized()


def apply_settings(c, settings: Settings) -> None:
    """Fill a traitlets config object from `settings`."""
    data = settings.data_dir
    data.mkdir(parents=True, exist_ok=True)

    c.JupyterHub.bind_url = settings.bind_url
    c.JupyterHub.db_url = f"sqlite:///{data / 'jupyterhub.sqlite'}"
    c.JupyterHub.cookie_secret_file = str(data / "jupyterhub_cookie_secret")
    c.JupyterHub.cleanup_servers = settings.cleanup_servers
    c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{settings.proxy_api_port}"
    c.ConfigurableHTTPProxy.pid_file = str(data / "jupyterhub-proxy.pid")

    c.JupyterHub.hub_port = settings.hub_port
    if _inside_the_hub():
        # Only the hub needs the bridge; `gpu-pool --config` reads this file too
        # and must not create Docker networks.
        gateway = docker_network_gateway(settings.docker_network)
        c.JupyterHub.hub_ip = gateway
        c.JupyterHub.hub_connect_ip = gateway

    c.JupyterHub.spawner_class = "gpu-docker"
    c.GPUDockerSpawner.network_name = settings.docker_network
    c.GPUDockerSpawner.prefix = settings.container_prefix
    c.GPUDockerSpawner.home_volume_name = settings.home_volume
    c.GPUDockerSpawner.pull_policy = "never"  # images are built here, never pulled
    c.GPUDockerSpawner.inventory_kind = settings.inventory
    c.GPUDockerSpawner.profiles = settings.profiles or default_profiles(settings)
    c.GPUDockerSpawner.lease_wait_timeout = settings.lease_wait_timeout
    c.GPUDockerSpawner.http_timeout = 120
    c.SimulatedInventory.count = settings.simulated_gpus
    c.SimulatedInventory.cuda_version = settings.simulated_cuda_version
    if settings.simulated_utilization_file:
        c.SimulatedInventory.utilization_file = settings.simulated_utilization_file
    c.GPUPool.db_url = settings.pool_db_url
    if settings.max_gpus_per_user is not None:
        c.GPUPool.max_gpus_per_user = settings.max_gpus_per_user

    if settings.authenticator == "dummy":
        print("WARNING: GPUHUB_AUTHENTICATOR=dummy: every user name logs in with one shared "
              "password. For tests only.", file=sys.stderr)
        c.JupyterHub.authenticator_class = "dummy"
        c.DummyAuthenticator.password = settings.dummy_password
        c.Authenticator.allow_all = True
    else:
        c.JupyterHub.authenticator_class = "gpu-directory"
        if settings.directory is not None:
            configure_directory(c, settings.directory)
        else:
            print("GPUHUB_DIRECTORY is not set: the directory login takes its settings from "
                  "c.DirectoryAuthenticator in a config file loaded after this one "
                  "(see hub_config/examples/).", file=sys.stderr)
    if settings.admin_users:
        c.Authenticator.admin_users = set(settings.admin_users)

    if settings.cull:
        from .culling import configure_culler

        configure_culler(c, settings)

    from .reconcile import start_in_hub

    start_in_hub()
