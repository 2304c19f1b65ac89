"""The GPU pool page: a hub-managed service at /services/gpu-pool/.

service.py adds it to the hub's config; app.py is the tornado app the hub
starts (`python -m spawner.poolpage`); handlers/ holds its handlers, one module
per resource (as JupyterHub's apihandlers/), on handlers/base.py.  The pure view
code is apart: views.py turns ledger data into what the page and the API show,
occupancy.py and charts.py usage over time, estimate.py wait estimates and cull
deadlines; scripts.py and hubapi.py run the admin actions; templates/ holds the
page, one partial per view.
"""

SERVICE_NAME = "gpu-pool"
ADMIN_SCOPE = "custom:gpu-pool:admin"
# Running code in other people's servers (action scripts): granted to no one by default.
EXEC_SCOPE = "custom:gpu-pool:exec"
