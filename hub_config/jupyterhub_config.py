# JupyterHub configuration for GPU JupyterHub: one file for the demo, the
# tests and production, driven by GPUHUB_* environment variables (see the
# README's configuration reference).  Settings are read and checked by
# spawner.settings; a missing or contradictory one stops the hub here with a
# message naming it.
#
#   jupyterhub -f hub_config/jupyterhub_config.py
#
# Anything below can still be overridden the usual way: load this file with
# `load_subconfig(...)` from your own config and set `c.X.y` after it.

import sys

from spawner.settings import SettingsError, apply_settings, load_settings

c = get_config()  # noqa: F821 (provided by traitlets when this file is loaded)

try:
    apply_settings(c, load_settings())
except SettingsError as error:
    # One clear line naming the setting, not a traceback.
    sys.exit(f"GPU JupyterHub configuration error: {error}")
