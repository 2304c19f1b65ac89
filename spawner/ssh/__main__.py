"""`python -m spawner.ssh`: the gpu-ssh service (SSH gateway and key page), as the hub starts it."""

from .app import main

main()
