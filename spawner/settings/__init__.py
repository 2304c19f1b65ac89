"""Deployment settings for hub_config/jupyterhub_config.py, from GPUHUB_* variables.

One place reads the environment and checks it; a missing or contradictory
setting raises SettingsError naming the variable, and the hub stops at start
with that message instead of failing later in a user's spawn.

The package's modules, one way: parsing (reading one variable) <- directory (the
directory login's settings) <- hub (all deployment settings, load_settings) <- apply
(settings into the traitlets config).
"""

from .apply import apply_settings, configure_directory, docker_network_gateway
from .directory import (
    DIRECTORY_KINDS,
    DIRECTORY_VARS,
    TLS_MODES,
    DirectorySettings,
    load_directory_settings,
)
from .hub import DEFAULT_CPU_IMAGE, DEFAULT_GPU_IMAGE, Settings, default_profiles, load_settings
from .parsing import SettingsError

__all__ = [
    "DEFAULT_CPU_IMAGE",
    "DEFAULT_GPU_IMAGE",
    "DIRECTORY_KINDS",
    "DIRECTORY_VARS",
    "TLS_MODES",
    "DirectorySettings",
    "Settings",
    "SettingsError",
    "apply_settings",
    "configure_directory",
    "default_profiles",
    "docker_network_gateway",
    "load_directory_settings",
    "load_settings",
]
