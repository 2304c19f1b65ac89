"""GPU-aware culling (issue #6): placeholder until the culler lands."""


def configure_culler(c, settings) -> None:
    """Add jupyterhub-idle-culler as a hub-managed service (filled by issue #6)."""
