"""Batch jobs: a command run on leased GPUs in a container, the GPUs freed when it exits.

request.py checks what a user submits (pure); settings.py is what the hub tells the
gpu-pool service about containers; runner.py runs jobs in the gpu-pool service, each a group
of units (group.py: one container, or a cluster's workers, cluster.py), built by spec.py
(pure) on an engine (engine.py); places.py holds room within the job limits (limits.py),
stops.py the jobs being stopped and why, reclaim.py gives borrowed GPUs back; reconcile.py
keeps job leases and units in agreement.
"""

JOBS_SCOPE = "custom:gpu-jobs"
