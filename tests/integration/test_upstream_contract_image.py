"""The jupyter-server part the images' gpuhub_activity extension relies on, checked where it
lives: inside the notebook image (tests/unit/test_upstream_contract.py checks the hub's side).

gpuhub_activity/lab.py: the status that an open JupyterLab tab polls must not count as
activity.  jupyter-server's switch for that is the handler attribute `_track_activity`
(its own comment: "set _track_activity = False on API handlers that shouldn't track activity")."""

from __future__ import annotations

from tests.fixtures.images import docker_run

TRACK_CHECK = """
import inspect
from jupyter_server.base.handlers import APIHandler
assert APIHandler._track_activity is True, "APIHandler._track_activity is gone"
source = inspect.getsource(APIHandler.update_api_activity)
assert "self._track_activity" in source and "api_last_activity" in source, source
print("ok")
"""


def test_jupyter_server_lets_a_handler_not_count_as_activity(notebook_image):
    proc = docker_run(notebook_image, "python3", "-c", TRACK_CHECK, entrypoint="")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "ok"


# gpuhub_activity/hub_dns.py: JupyterHub's HTTP client is a singleton whose connector takes
# `connector_options` (made lazily, inside the loop), closes and forgets itself with close(), and
# aiohttp's default resolver is c-ares (what the swap replaces: its cache outlives the hub's address).
RESOLVER_CHECK = """
import asyncio, inspect, logging
import aiohttp
from aiohttp.resolver import DefaultResolver
from jupyterhub.httpclient import JupyterHubHTTPClient
from gpuhub_activity import hub_dns
assert "connector_options" in inspect.getsource(JupyterHubHTTPClient._new_connector)
assert "clear_instance()" in inspect.getsource(JupyterHubHTTPClient.close)
print("default", DefaultResolver.__name__)

async def main():
    JupyterHubHTTPClient.instance()._session  # a session made before the swap, as the version check does
    hub_dns.use_system_resolver(logging.getLogger())
    await asyncio.sleep(0.2)
    session = JupyterHubHTTPClient.loop_instance()._session
    print("after", type(session.connector._resolver).__name__)
    await JupyterHubHTTPClient.instance().close()

from tornado.ioloop import IOLoop
IOLoop.current().run_sync(main)
"""


def test_the_servers_hub_client_looks_the_hub_up_afresh(notebook_image):
    proc = docker_run(notebook_image, "python3", "-c", RESOLVER_CHECK, entrypoint="")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["default", "AsyncResolver", "after", "ThreadedResolver"], proc.stdout
