"""The gpu-pool service's settings file: what the hub writes for it, from its final config.

One file of traitlets config sections (poolpage/service_config.py reads it): the page's
settings, its limits, the notification e-mail's settings and, with jobs, the jobs' settings.
Registered by apply_settings after every part of the service is configured; written by the hub
once every config file is loaded.
"""

from __future__ import annotations

import json

from traitlets import TraitError

from ..notify import EmailNotifications
from ..notify.settings import BrowserNotifications, Notifications, WebhookNotifications
from ..poolpage.limits import PoolServiceLimits
from ..poolpage.service_config import FILE_NAME, PoolPageSettings, config_values
from ..services.lifecycle import write_when_config_loaded
from .culler import activity_interval, page_cull_values
from .pool_jobs import job_settings, spawner_profiles


def service_config(c, settings) -> dict:
    """The sections the service reads (poolpage/service_config.py), from hub config `c`."""
    page = config_values(PoolPageSettings(config=c))
    # The deadlines and wait estimates by the culler's rules (0: the hub does not cull), and when a
    # server counts as idle (two missed activity reports), from the same final config as the culler's.
    # An option set in c.PoolPageSettings itself stands.
    derived = (page_cull_values(c) if settings.cull else
               {"cull_timeout_gpu": 0, "cull_timeout_cpu": 0, "cull_every": 0, "cull_rules": "",
                "gpu_idle_percent": 0.0})
    derived["idle_after"] = 2 * activity_interval(c, settings.activity_interval)
    page.update({name: value for name, value in derived.items() if name not in c.PoolPageSettings})
    if "profiles" not in c.PoolPageSettings:  # the spawner's own, from the final config
        page["profiles"] = spawner_profiles(c)
    sections = {"PoolPageSettings": page, "PoolServiceLimits": config_values(PoolServiceLimits(config=c)),
                # the mails' settings (spawner/notify/); the SMTP password stays in its own file
                "EmailNotifications": config_values(EmailNotifications(config=c)),
                "Notifications": config_values(Notifications(config=c)),
                # the allow-list and where the secret is; the secret itself stays in its own file
                "WebhookNotifications": config_values(WebhookNotifications(config=c)),
                "BrowserNotifications": config_values(BrowserNotifications(config=c))}
    if "reclaim_grace" in c.GPUPool:  # the notice the service gives borrowed servers (server_reclaim.py)
        sections["GPUPool"] = {"reclaim_grace": c.GPUPool.reclaim_grace}
    if settings.jobs:
        sections["JobSettings"] = job_settings(c, settings).as_dict()
    if "SwarmInventory" in c:  # the nodes the service's jobs may lease from, as the hub's servers
        sections["SwarmInventory"] = dict(c.SwarmInventory)
    return sections


def render_service_config(c, settings) -> str:
    """The service's file, as the hub writes it."""
    return json.dumps(service_config(c, settings), sort_keys=True, indent=1)


def write_service_config(settings, path) -> None:
    """In the hub, once every config file is loaded: the service's file, from the final config."""
    def render(hub) -> str | None:
        try:
            return render_service_config(hub.config, settings)
        except (TraitError, ValueError) as exc:  # e.g. c.JobLimits set wrong in a later config file
            hub.log.critical("The gpu-pool service's settings are wrong: %s", exc)
            hub.exit(1)
            return None

    write_when_config_loaded(path, render)


def write_when_the_hub_starts(settings) -> None:
    """Have the hub write the service's file (where configure_pool_page told the service to look)."""
    write_service_config(settings, settings.data_dir / FILE_NAME)
