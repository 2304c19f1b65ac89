"""The images' own package (images/jupyter, `gpuhub-jupyter`) as pip installed it in the
builder stage: the server extension and the prebuilt JupyterLab extension enabled, gpu-job
on PATH, and nothing of the host's npm settings, the npm packages or Node.js in the image."""

from __future__ import annotations

import json
import re
import subprocess

from tests.fixtures.images import docker_run


def host_npm_values() -> set[str]:
    """The registry, CA file and proxies the host's npm is configured with."""
    values: set[str] = set()
    for key in ("registry", "cafile", "proxy", "https-proxy"):
        out = subprocess.run(["npm", "config", "get", key], capture_output=True, text=True)
        value = out.stdout.strip()
        if out.returncode == 0 and value not in ("", "null", "undefined"):
            values.add(value.rstrip("/"))
    return values


def test_the_images_package_is_installed_by_pip_with_its_extensions(notebook_image):
    out = docker_run(notebook_image, "sh", "-c",
                     "pip show gpuhub-jupyter | head -2; command -v gpu-job; gpu-job --help | head -1;"
                     " jupyter labextension list 2>&1; jupyter server extension list 2>&1", entrypoint="")
    assert out.returncode == 0, out.stderr[-2000:]
    text = re.sub(r"\x1b\[[0-9;]*m", "", out.stdout)  # jupyter's colours
    assert "Name: gpuhub-jupyter" in text and "/opt/notebook/bin/gpu-job" in text
    assert "usage: gpu-job" in text
    assert re.search(r"gpuhub-lab v1\.0\.0 enabled OK", text), text
    assert re.search(r"gpuhub_activity enabled", text) and "jupyter_resource_usage" in text
    # prebuilt: the bundle is there, its sources and build tools are not
    files = docker_run(notebook_image, "sh", "-c",
                       "cat /opt/notebook/share/jupyter/labextensions/gpuhub-lab/package.json;"
                       " ls /opt/notebook/share/jupyter/labextensions/gpuhub-lab/static | head -3", entrypoint="")
    assert json.loads(files.stdout.split("\n}")[0] + "\n}")["name"] == "gpuhub-lab"


def test_the_image_keeps_none_of_the_hosts_npm_settings_nor_node(notebook_image):
    history = subprocess.run(["docker", "history", "--no-trunc", "--format", "{{.CreatedBy}}", notebook_image],
                             capture_output=True, text=True, check=True).stdout
    for value in host_npm_values():
        assert value not in history, f"host npm setting {value!r} is in the image history"
    leftovers = docker_run(notebook_image, "sh", "-c",
                           "command -v node nodejs npm; ls -d /tmp/jupyter /root/.npmrc /root/.npm /etc/npmrc"
                           " 2>/dev/null; find / -xdev \\( -name .npmrc -o -name node_modules \\) 2>/dev/null; true",
                           entrypoint="")
    assert leftovers.stdout.strip() == "", leftovers.stdout
