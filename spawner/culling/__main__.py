"""`python -m spawner.culling`: the GPU-aware idle culler, as the hub starts it."""

from .culler import main

main()
