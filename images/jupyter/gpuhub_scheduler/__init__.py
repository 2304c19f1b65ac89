"""Jupyter Scheduler's backend for GPU JupyterHub ("Create a notebook job" runs on the hub).

backend.py   the BaseScheduler and EnvironmentManager jupyter_scheduler is configured with
             (etc/jupyter/jupyter_server_config.d/gpuhub_scheduler.json), on the hub's
             jobs and schedules APIs
mapping.py   the mapping between the two, pure (the repository's unit tests check it)

Importing this package imports nothing of jupyter_scheduler: only backend.py does, in the
images that have it.
"""
