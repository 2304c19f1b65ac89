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

A server adopted by a new hub process (an upgrade with `cleanup_servers = False`, a
restart) has no `api_token`: JupyterHub keeps only tokens' hashes.  The spawner then
asks with a token of its own making: the user's, scoped to this one server
(`access:servers!server=<user>/<name>`, which is all Jupyter Server's JupyterHub
authorizer checks), expiring in a minute and deleted once the stop has been tried.
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


# The lifetime of a token made for one shutdown request (it is deleted as soon as it has served).
STOP_TOKEN_SECONDS = 60


def stop_token_scope(spawner) -> str:
    """The one scope a shutdown request needs: access to this server, nothing else."""
    return f"access:servers!server={spawner.user.name}/{spawner.name}"


def make_stop_token(spawner) -> str | None:
    """A short-lived token of the server's user for its own server (JupyterHub's
    `User.new_api_token`, which `User.spawn` uses for the server's token); None if the hub
    would not make one (the slow stop then runs)."""
    try:
        return spawner.user.new_api_token(note=f"gpu-swarm: stop {spawner.server_label}",
                                          scopes=[stop_token_scope(spawner)], expires_in=STOP_TOKEN_SECONDS)
    except Exception as exc:
        spawner.log.info("Could not make a token to ask %s's server to exit (%s); Swarm stops it",
                         spawner.server_label, exc)
        return None


def drop_stop_token(spawner, token: str) -> None:
    from jupyterhub import orm

    try:
        db = spawner.user.db
        found = orm.APIToken.find(db, token)
        if found is not None:
            db.delete(found)
            db.commit()
    except Exception as exc:  # it expires within STOP_TOKEN_SECONDS anyway
        spawner.log.warning("Could not delete the stop token of %s: %s", spawner.server_label, exc)


async def ask_server_to_exit(spawner) -> bool:
    """True when the server's task ended after its Jupyter server was asked to shut down."""
    if spawner.server is None:
        return False
    if spawner.api_token:
        return await _ask(spawner, spawner.api_token)
    # Adopted by this hub process: no token of the server's own (see the module docstring).
    token = make_stop_token(spawner)
    if not token:
        return False
    try:
        return await _ask(spawner, token)
    finally:
        drop_stop_token(spawner, token)


async def _ask(spawner, token: str) -> bool:
    url = f"{spawner.server.url.rstrip('/')}/api/shutdown"
    began = time.monotonic()
    try:
        await AsyncHTTPClient().fetch(HTTPRequest(
            url, method="POST", body=b"", headers={"Authorization": f"token {token}"},
            connect_timeout=REQUEST_TIMEOUT, request_timeout=REQUEST_TIMEOUT))
    except HTTPClientError as exc:
        # 599: the server closed the connection or took long to answer, as one does that
        # cleans up before it answers and stops its loop: it may be exiting, so watch its task.
        if exc.code != 599:
            spawner.log.info("%s's server refused the shutdown request (%s); Swarm stops it",
                             spawner.server_label, exc)
            return False
        spawner.log.info("%s's server gave no answer to the shutdown request at %s (%s); watching its task",
                         spawner.server_label, url, exc)
    except Exception as exc:  # not listening (yet), unreachable: Swarm stops it
        spawner.log.info("%s's server did not take the shutdown request (%s); Swarm stops it",
                         spawner.server_label, exc)
        return False
    deadline = time.monotonic() + EXIT_WAIT_SECONDS
    while time.monotonic() < deadline:
        task = await spawner.get_task()
        if not task or (task.get("Status") or {}).get("State") not in LIVE_TASK_STATES:
            spawner.log.info("%s's server exited %.1f s after it was asked to", spawner.server_label,
                             time.monotonic() - began)
            return True
        await asyncio.sleep(EXIT_LOOK_SECONDS)
    spawner.log.info("%s's server did not exit within %g s of its shutdown; Swarm stops it",
                     spawner.server_label, EXIT_WAIT_SECONDS)
    return False
