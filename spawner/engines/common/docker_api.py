"""The one place that uses docker-py's private parts, so an upgrade that moves them fails here
and in its contract test (tests/unit/test_upstream_contract.py), not somewhere in a log stream.

docker-py has no public call for a Swarm service's followed logs as a stream that can be closed,
and its log streams keep the client's read timeout (a quiet job would end its follower).  What
this module reaches: `APIClient._get`, `_url`, `_raise_for_status`,
`_multiplexed_response_stream_helper`, and the socket under a response
(`CancellableStream._response.raw._fp.fp`, urllib3's, then `._sock`).  When one is gone it
logs a warning and the stream keeps its timeout, rather than failing quietly.
"""

from __future__ import annotations

import logging

log = logging.getLogger("gpu-pool.docker-api")


def docker_api(timeout: float = 60):
    """A low-level docker-py client from the environment (DOCKER_HOST...), with `timeout`."""
    import docker

    return docker.APIClient(**docker.utils.kwargs_from_env(), timeout=timeout)


def no_read_timeout(source) -> bool:
    """Clear the socket read timeout under a docker-py log stream, so a quiet follower waits.

    False (with a warning) where the stream is not docker-py's over a socket as expected."""
    try:
        sock_fp = source._response.raw._fp.fp
        sock = (sock_fp.raw if hasattr(sock_fp, "raw") else sock_fp)._sock
        sock.settimeout(None)
    except AttributeError as exc:
        log.warning("Cannot clear a log stream's read timeout (docker-py or urllib3 changed: %s); "
                    "a follower of a quiet job may end after the client's timeout", exc)
        return False
    return True


def follow_service_logs(api, name: str):
    """Swarm service `name`'s logs, followed, as docker-py's CancellableStream (close() ends it).

    Raises docker.errors.NotFound when the service is gone."""
    from docker.types.daemon import CancellableStream

    response = api._get(api._url("/services/{0}/logs", name), stream=True,
                        params={"follow": True, "stdout": True, "stderr": True, "tail": "all"})
    api._raise_for_status(response)
    source = CancellableStream(api._multiplexed_response_stream_helper(response), response)
    no_read_timeout(source)
    return source
