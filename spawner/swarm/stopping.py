"""A quick stop on Swarm: the server is asked to exit before Swarm is told to remove its task.

Swarm stops a task slowly: a task attached to an overlay network is first taken
out of the network's service discovery and Docker's Swarm executor then waits
2 s for gossip to converge before it even signals the container (moby's
executor/container/controller.go, not configurable), and only then does the
container get SIGTERM.  A server that has exited on its own is past all that:
its task reads `complete` as soon as its node reports the exit, and the lease
can end then.  So the spawner first asks the user's Jupyter server to shut
down through Jupyter Server's own `POST /api/shutdown`, authenticated with the
server's own token (the same clean-up as on SIGTERM: kernels are shut down),
and waits a few seconds for its task to end; then it removes the service as
before.  The guarantee is unchanged: the lease ends only once Swarm reports no
task given it still live (lending/ending.py).
"""

from __future__ import annotations

import asyncio
import time

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from .tasks import LIVE_TASK_STATES

EXIT_WAIT_SECONDS = 5.0  # after the shutdown was accepted; then Swarm stops it as before
REQUEST_TIMEOUT = 3.0
# The task is looked at this often while the server exits, not less and less often: the exit
# comes about a second after the request (Jupyter Server's clean-up), and a backing-off look
# found it up to 0.5 s late, every stop (bench/bench_swarm.py).  A look is two manager calls.
EXIT_LOOK_SECONDS = 0.1


async def ask_server_to_exit(spawner) -> bool:
    """True when the server's task ended after its Jupyter server was asked to shut down."""
    server, token = spawner.server, spawner.api_token
    if server is None or not token:
        return False
    url = f"{server.url.rstrip('/')}/api/shutdown"
    try:
        await AsyncHTTPClient().fetch(HTTPRequest(
            url, method="POST", body=b"", headers={"Authorization": f"token {token}"},
            connect_timeout=REQUEST_TIMEOUT, request_timeout=REQUEST_TIMEOUT))
    except HTTPClientError as exc:
        # 599: the server closed the connection or took long to answer, as one does that
        # cleans up before it answers and stops its loop: it may be exiting, so watch its task.
        if exc.code != 599:
            spawner.log.info("%s's server refused the shutdown request (%s); Swarm stops it",
                             spawner._log_name, exc)
            return False
    except Exception as exc:  # not listening (yet), unreachable: Swarm stops it
        spawner.log.info("%s's server did not take the shutdown request (%s); Swarm stops it",
                         spawner._log_name, exc)
        return False
    deadline = time.monotonic() + EXIT_WAIT_SECONDS
    while time.monotonic() < deadline:
        task = await spawner.get_task()
        if not task or (task.get("Status") or {}).get("State") not in LIVE_TASK_STATES:
            return True
        await asyncio.sleep(EXIT_LOOK_SECONDS)
    spawner.log.info("%s's server did not exit within %g s of its shutdown; Swarm stops it",
                     spawner._log_name, EXIT_WAIT_SECONDS)
    return False
