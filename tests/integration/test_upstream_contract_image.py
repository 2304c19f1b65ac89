"""The private part of jupyterhub-singleuser that spawner/culling/culler.py's wrapper relies on,
checked where it lives: inside the notebook image (see tests/unit/test_upstream_contract.py)."""

from __future__ import annotations

from tests.fixtures.images import docker_run

CHECK = """
import inspect
from jupyterhub.singleuser.extension import JupyterHubSingleUser as App
method = App.notify_activity
assert inspect.iscoroutinefunction(method), "notify_activity is no longer a coroutine"
assert list(inspect.signature(method).parameters) == ["self"], inspect.signature(method)
assert "serverapp" in inspect.getsource(App), "the extension no longer keeps its serverapp"
print("ok")
"""


def test_singleuser_notify_activity_is_an_async_method_the_wrapper_can_replace(notebook_image):
    proc = docker_run(notebook_image, "python3", "-c", CHECK, entrypoint="")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "ok"
