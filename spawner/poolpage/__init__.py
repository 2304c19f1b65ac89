"""The GPU pool page: a hub-managed service at /services/gpu-pool/.

service.py adds it to the hub's config; app.py is the tornado app the hub
starts (`python -m spawner.poolpage`) with its base handlers; views.py turns
ledger data into what the page and the API show; history_api.py (occupancy.py,
charts.py) shows usage over time, insight.py (estimate.py) wait estimates and
cull deadlines, actions_api.py (scripts.py, hubapi.py) the admin actions;
templates/ holds the page, one partial per view.
"""

SERVICE_NAME = "gpu-pool"
ADMIN_SCOPE = "custom:gpu-pool:admin"
# Running code in other people's servers (action scripts): granted to no one by default.
EXEC_SCOPE = "custom:gpu-pool:exec"
