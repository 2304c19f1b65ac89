"""The GPU pool page: a hub-managed service at /services/gpu-pool/.

service.py adds it to the hub's config; app.py is the tornado app the hub
starts (`python -m spawner.poolpage`); views.py turns ledger data into what the
page and the API show; templates/ holds the page.
"""

SERVICE_NAME = "gpu-pool"
ADMIN_SCOPE = "custom:gpu-pool:admin"
