"""What a user meets in their first minute: bytecode shipped, no news prompt.

The notebook user cannot write into /opt/notebook, so a module without
shipped bytecode is compiled again at every server start and in every
kernel.  These tests import what a server and a kernel import, as the
notebook user, and look for modules that had to be compiled.
"""

from __future__ import annotations

import json
import re

import requests

from ..fixtures.images import docker_run

# Prints the modules from /opt/notebook that were imported without bytecode
# on disk (Python compiled them in memory), and the kinds of .pyc shipped.
MISSING_BYTECODE = r"""
import importlib.util, json, os, sys
{imports}
missing, kinds = [], {{}}
for name, module in list(sys.modules.items()):
    path = getattr(module, "__file__", None) or ""
    if not (path.startswith("/opt/notebook/") and path.endswith(".py")):
        continue
    cached = importlib.util.cache_from_source(path)
    if not os.path.exists(cached):
        missing.append(name)
        continue
    with open(cached, "rb") as f:
        flags = int.from_bytes(f.read(8)[4:8], "little")
    kinds[flags] = kinds.get(flags, 0) + 1
print(json.dumps({{"missing": sorted(missing), "kinds": kinds}}))
"""

SERVER_AND_KERNEL = ("import jupyter_server.serverapp, jupyterlab, jupyterhub.singleuser, "
                     "ipykernel.kernelapp, gpuhub_activity")


def missing_bytecode(image: str, imports: str) -> dict:
    out = docker_run(image, "python", "-c", MISSING_BYTECODE.format(imports=imports))
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_server_and_kernel_start_from_shipped_bytecode(notebook_image):
    # As the image's user (jovyan), who cannot write /opt/notebook.
    result = missing_bytecode(notebook_image, SERVER_AND_KERNEL)
    assert result["missing"] == [], f"{len(result['missing'])} modules compiled at import: {result['missing'][:20]}"
    # Hash-based .pyc that Python does not check against the source (flags 1):
    # the same bytes from the same inputs, whatever the files' timestamps.
    assert set(result["kinds"]) == {"1"}, result["kinds"]


def test_tensorflow_imports_from_shipped_bytecode(mkl_image):
    result = missing_bytecode(mkl_image, "import tensorflow as tf, keras, sklearn.datasets")
    assert result["missing"] == [], f"{len(result['missing'])} modules compiled at import: {result['missing'][:20]}"


def test_jupyterlab_never_asks_about_news_or_updates(make_hub):
    hub = make_hub()
    hub.create_user("alice")
    token = hub.user_token("alice")
    hub.start_server("alice", {"profile": "tf-cpu"})
    headers = {"Authorization": f"token {token}"}
    base = f"{hub.url}/user/alice/lab"

    # The notification settings a new user starts with: never fetch news, no update checks.
    r = requests.get(f"{base}/api/settings/@jupyterlab/apputils-extension:notification",
                     headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    properties = r.json()["schema"]["properties"]
    assert properties["fetchNews"]["default"] == "false"
    assert properties["checkForUpdates"]["default"] is False

    # The page tells JupyterLab that news are off, so it never shows the prompt.
    page = requests.get(base, headers=headers, timeout=30)
    assert page.status_code == 200, page.text[:500]
    config = json.loads(re.search(r'id="jupyter-config-data"[^>]*>(.*?)</script>', page.text, re.S).group(1))
    assert config["news"] == {"disabled": True}
    # And the server fetches nothing from the internet for it.
    news = requests.get(f"{base}/api/news", headers=headers, timeout=30)
    assert news.status_code == 200 and news.json()["news"] == []
