"""Who is asking a hub-managed service of this project, asked of the hub without blocking its loop.

JupyterHub's `HubAuthenticated.get_current_user` is synchronous: a token or cookie not in its
cache is checked with a blocking call to the hub.  The services here (the pool page, the SSH
gateway's key page) serve other requests and streams on the same loop, so they ask in
`prepare()`, asynchronously and within a time limit, and `get_current_user` then only reads
the answer HubAuth keeps on the handler (`_cached_hub_user`: tests/unit/test_upstream_contract.py).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from tornado import web

log = logging.getLogger("gpuhub.service-auth")


if TYPE_CHECKING:
    from jupyterhub.services.auth import HubOAuthenticated

    class _Handler(HubOAuthenticated, web.RequestHandler):
        pass
else:
    # A mixin at run time: a RequestHandler base here would change the method order of the
    # handlers it joins (tornado's methods above HubAuthenticated's).
    _Handler = object


class AsksTheHubFirst(_Handler):
    """Mixin, before `HubOAuthenticated` in the bases: the hub's answer, awaited in prepare()."""

    def hub_auth_timeout(self) -> float:
        """Seconds to wait for the hub's answer before a 503."""
        raise NotImplementedError

    async def prepare(self):
        timeout = self.hub_auth_timeout()
        try:
            await asyncio.wait_for(self.hub_auth.get_user(self, sync=False), timeout)
        except TimeoutError:
            log.warning("The hub did not identify a %s %s request within %g s", self.request.method,
                        self.request.path, timeout)
            raise web.HTTPError(503, f"The hub did not confirm who you are within {timeout:g} s; "
                                     "try again in a moment") from None
        result = super().prepare()
        if result is not None:
            await result

    def get_current_user(self):
        if not hasattr(self, "_cached_hub_user"):
            # prepare() did not run or failed before asking (an error page): nobody, rather
            # than a blocking call to the hub on the event loop.
            return None
        return super().get_current_user()
