"""What every GPU spawner shares, whatever engine runs the server.

    spawner    GPULendingSpawner: profiles, the spawn form, the lease around a server's life
    ending     how a lease ends: its reason, and release once nothing given it still runs
    admission  how many servers one hub starts at once (queued GPU spawns not counted)
"""

from .spawner import GPULendingSpawner, configured_inventory, shared_pool

__all__ = ["GPULendingSpawner", "configured_inventory", "shared_pool"]
