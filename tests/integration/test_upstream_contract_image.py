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
