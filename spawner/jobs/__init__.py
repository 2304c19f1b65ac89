"""Batch jobs: a command run on leased GPUs in a container, the GPUs freed when it exits.

request.py checks what a user submits (pure); settings.py is what the hub tells the
gpu-pool service about containers; spec.py builds a job's container (pure);
runner.py runs jobs in the gpu-pool service; reconcile.py keeps job leases and
containers in agreement; config.py adds scopes and settings to the hub's config.
"""

JOBS_SCOPE = "custom:gpu-jobs"
