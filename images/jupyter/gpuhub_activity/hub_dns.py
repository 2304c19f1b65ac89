"""The hub's address looked up afresh for each connection this server opens to it.

JupyterHub 6's HTTP client (jupyterhub.httpclient, aiohttp) resolves the hub's name with
aiohttp's default resolver, c-ares through aiodns, whose own cache keeps an answer for the
record's TTL: Docker's embedded DNS answers with 600 s.  On Swarm the hub is a task that
servers reach by a name (`gpuhub-hub`); a stack upgrade replaces it with a new address, and
a server kept through the upgrade went on asking the old one, so it could not check its
users' tokens for up to ten minutes (its JupyterLab answered 500 "Failed to connect to Hub
API").  glibc's getaddrinfo keeps no cache and asks Docker's DNS each time, which already
answers the new address; aiohttp's own table (10 s) still spares repeated lookups.

The client is a singleton made without config, so the resolver is set on the instance made
once the server's loop runs (a session made before that, by the start-up version check, is
closed first).  Its members are named in tests/integration/test_upstream_contract_image.py.
"""

from __future__ import annotations


def use_system_resolver(log) -> None:
    """Once the loop runs: JupyterHub's HTTP client with aiohttp's ThreadedResolver."""
    try:
        from jupyterhub.httpclient import JupyterHubHTTPClient
    except ImportError:  # JupyterHub before 6 uses tornado's client, which asks getaddrinfo
        return
    from tornado.ioloop import IOLoop

    async def swap() -> None:
        from aiohttp import ThreadedResolver

        if JupyterHubHTTPClient.initialized():
            await JupyterHubHTTPClient.instance().close()
        JupyterHubHTTPClient.instance(connector_options={"resolver": ThreadedResolver()})
        log.info("gpuhub_activity: the hub's address is looked up afresh (getaddrinfo), not kept by c-ares")

    IOLoop.current().add_callback(swap)
