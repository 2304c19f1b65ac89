"""What the gpu-pool service knows of the hub: one file of traitlets config sections.

The hub hands the service its settings the way it reads its own: as traits of
Configurables.  It writes `<data_dir>/gpu-pool-service.json` from its final
config (every config file loaded, so options set after hub_config count) and
starts the service with GPUHUB_POOL_SERVICE_CONFIG_FILE naming it.  The file
holds the sections `PoolPageSettings` (below), `PoolServiceLimits` (limits.py)
and, with jobs, `JobSettings` (jobs/runner_settings.py); the service loads it with
`load_service_config` and builds each from it.  The ledger's URL, a secret,
stays in the service's environment (GPUHUB_POOL_DB_URL, as for the CLI).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from traitlets import Bool, Dict, Float, Int, List, Unicode
from traitlets.config import Config, Configurable

CONFIG_FILE_ENV = "GPUHUB_POOL_SERVICE_CONFIG_FILE"
FILE_NAME = "gpu-pool-service.json"


class PoolPageSettings(Configurable):
    """The hub's settings the pool page shows or acts on.  The hub sets them from its GPUHUB_*
    settings (settings/pool_service.py); set one in jupyterhub_config.py only to override that."""

    show_holders = Bool(False, config=True, help="""
        Show every user who holds or waits for GPUs by name (GPUHUB_POOL_PAGE_SHOW_HOLDERS);
        otherwise only pool admins and the holder themself see a name.
        """)
    cull_timeout_gpu = Int(0, config=True, help="""
        The culler's idle seconds for a GPU server, for the deadlines and wait estimates the page
        shows (0: the hub does not cull).
        """)
    cull_timeout_cpu = Int(0, config=True, help="The culler's idle seconds for a CPU server (0: not culled).")
    cull_every = Int(0, config=True, help="Seconds between the culler's rounds (0: the hub does not cull).")
    cull_rules = Unicode("", config=True, help="""
        The culler's rules as JSON (culling/deadline.py CullRules), so that the deadlines shown are
        those applied; empty: only `cull_timeout_gpu`.
        """)
    gpu_idle_percent = Float(0.0, config=True, help="""
        The culler's GPU-idle rule, told in JupyterLab's GPU panel: utilisation below this percent
        counts as idle (0: the rule is off).
        """)
    gpu_idle_seconds = Float(0.0, config=True, help="How long a GPU must stay below `gpu_idle_percent`.")
    idle_after = Int(600, config=True, help="""
        Seconds after its last activity report that a server counts as idle now (two of the
        servers' activity intervals).
        """)
    inventory = Unicode("", config=True, help="""
        The hub's inventory kind (nvml, static, simulated, swarm), so that GPU utilisation is read
        as the culler reads it.
        """)
    simulated_gpus = Int(0, config=True, help="With the simulated inventory: how many GPUs it has.")
    utilization_file = Unicode("", config=True, help="With the simulated inventory: its utilisation file.")
    proxy_url = Unicode("http://127.0.0.1:8000", config=True, help="""
        Where the service reaches the hub's proxy on this machine (action scripts go through it to
        each server): the hub's bind address, a wildcard read as loopback.
        """)
    proxy_validate_cert = Bool(True, config=True, help="""
        Whether the proxy's TLS certificate is checked (off for the hub's own https proxy, whose
        certificate is usually self-signed on this hop).
        """)
    bridge_ip = Unicode("", config=True, help="""
        The hub's address on the containers' network (the Docker bridge, or the Swarm overlay),
        where the service also listens for the notebook servers; empty: 127.0.0.1 only.
        """)
    profiles = List(Dict(), config=True, help="""
        The spawner's profiles, as configured (the hub writes `c.GPUDockerSpawner.profiles` here),
        so that JupyterLab's GPU panel can say how many GPUs each profile could have now, with
        jobs on or off.
        """)


def config_values(configurable: Configurable) -> dict:
    """Every configurable trait's value: a section of the service's file."""
    return {name: getattr(configurable, name) for name in sorted(configurable.trait_names(config=True))}


def load_service_config(environ=os.environ) -> Config:
    """The sections the hub wrote (an empty Config when the service runs without a hub).
    A named file that cannot be read is an error: the service must not run on defaults."""
    path = environ.get(CONFIG_FILE_ENV, "")
    if not path:
        return Config()
    try:
        return Config(json.loads(Path(path).read_text()))
    except (OSError, ValueError) as exc:
        raise RuntimeError(f"{CONFIG_FILE_ENV}={path}: the hub's settings for this service cannot be read "
                           f"({exc})") from None
