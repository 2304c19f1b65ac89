"""`python -m spawner.poolpage`: the gpu-pool service, as the hub starts it."""

from .app import main

main()
