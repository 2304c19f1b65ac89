"""GPU-aware idle culling: jupyterhub-idle-culler with a cull arbiter that knows leases.

    policy   the GPU-idle rule, pure: which server may be culled, and why not
    culler   the culler application (`python -m spawner.culling`); its hub wiring: settings/culler.py
"""

from .policy import GPUCullPolicy, Verdict

_CULLER_NAMES = ("GPUIdleCuller",)


def __getattr__(name):
    # Lazy: the policy alone must import without jupyterhub-idle-culler (the device check).
    if name in _CULLER_NAMES:
        from . import culler

        return getattr(culler, name)
    raise AttributeError(name)


__all__ = ["GPUCullPolicy", "Verdict", *_CULLER_NAMES]
