"""The hub image's build (images/build_hub.py) without Docker: what goes in, and its tag."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
IMAGES = REPO / "images"
_spec = importlib.util.spec_from_file_location("gpuhub_images_build_hub", IMAGES / "build_hub.py")
build_hub = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build_hub)


def test_the_inputs_hold_the_whole_package_its_config_and_the_proxy_lock():
    inputs = {str(p.relative_to(REPO)) for p in build_hub.input_files()}
    # every module and package-data file of the package (the wheel is built from them) ...
    package = {str(p.relative_to(REPO)) for p in (REPO / "spawner").rglob("*")
               if p.is_file() and "__pycache__" not in p.parts}
    assert package <= inputs
    assert any(name.endswith(".html") for name in package)  # templates ship as package data
    # ... what pyproject.toml builds it with, the one config, and the image's own files
    assert {"pyproject.toml", "README.md", "LICENSE", "hub_config/jupyterhub_config.py",
            "images/hub/Dockerfile", "images/hub/hub-entrypoint.sh", "images/hub/package.json",
            "images/hub/package-lock.json"} <= inputs
    assert not any(name.endswith(".pyc") for name in inputs)


def test_everything_the_dockerfile_copies_is_put_in_the_context():
    dockerfile = (IMAGES / "hub" / "Dockerfile").read_text()
    sources = {line.split()[1].rstrip("/") for line in dockerfile.splitlines()
               if line.startswith("COPY ") and "--from=" not in line}
    # build_hub._build_locked writes these into the context (wheelhouse: the wheels; chp: node_modules)
    made = {"wheelhouse", "requirements.txt", "chp", "jupyterhub_config.py"} | set(build_hub.HUB_FILES)
    assert sources <= made, sources - made
    source = Path(build_hub.__file__).read_text()
    for name in ("wheelhouse", "requirements.txt", "chp", "jupyterhub_config.py"):
        assert f'"{name}"' in source


def test_the_image_installs_this_package_with_postgresql_and_the_hubs_jupyterhub():
    lines = build_hub.requirements_text().splitlines()
    assert f"jupyterhub-gpuspawner[postgres]=={metadata.version('jupyterhub-gpuspawner')}" in lines
    assert f"jupyterhub=={metadata.version('jupyterhub')}" in lines  # the notebook images pin the same


def admits(engines: str, major: int) -> bool:
    """Whether an npm `engines.node` range (the forms the lock file uses) admits Node `major`.x."""
    for alternative in engines.split("||"):
        bounds = re.findall(r"(>=|\^|~|<|=)?\s*v?(\d+)(?:\.[\dx*]+)*", alternative.strip())
        fits = True
        for op, number in bounds:
            n = int(number)
            fits &= {">=": major >= n, "^": major == n, "~": major == n, "<": major < n}.get(op, major == n)
        if bounds and fits:
            return True
    return False


def test_the_proxy_is_pinned_to_a_version_debians_node_runs():
    lock = json.loads((IMAGES / "hub" / "package-lock.json").read_text())
    chp = lock["packages"]["node_modules/configurable-http-proxy"]
    assert chp["version"] == json.loads((IMAGES / "hub" / "package.json").read_text())["dependencies"][
        "configurable-http-proxy"]
    # Debian bookworm's nodejs is 18: the lock's packages must all run on it
    for name, package in lock["packages"].items():
        wanted = (package.get("engines") or {}).get("node", "")
        assert wanted in ("", "*") or admits(wanted, 18), f"{name} needs Node {wanted}"
    # nothing of the registry the host used is committed
    assert not any("resolved" in package for package in lock["packages"].values())


def test_the_tag_changes_with_the_package_the_config_and_the_lock(tmp_path, monkeypatch):
    # a copy of the inputs, so that changing one leaves the checkout alone
    for path in build_hub.input_files():
        target = tmp_path / path.relative_to(REPO)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    monkeypatch.setattr(build_hub, "REPO", tmp_path)
    monkeypatch.setattr(build_hub, "HUB_DIR", tmp_path / "images" / "hub")
    monkeypatch.setattr(build_hub, "CONFIG_FILE", tmp_path / "hub_config" / "jupyterhub_config.py")
    monkeypatch.setattr(build_hub.notebook_build, "image_id", lambda ref: "sha256:base")
    requirements = build_hub.requirements_text()
    seen = {build_hub.inputs_hash("gpuhub/debian-base:x", requirements)}
    assert build_hub.inputs_hash("gpuhub/debian-base:x", requirements) in seen  # stable
    for changed in ("spawner/poolpage/app.py", "hub_config/jupyterhub_config.py", "images/hub/package-lock.json",
                    "images/hub/hub-entrypoint.sh"):
        (tmp_path / changed).write_text((tmp_path / changed).read_text() + "\n")
        digest = build_hub.inputs_hash("gpuhub/debian-base:x", requirements)
        assert digest not in seen, changed
        seen.add(digest)
    assert build_hub.inputs_hash("gpuhub/debian-base:x", requirements + "x==1\n") not in seen
    # a byte-compiled file is no input
    (tmp_path / "spawner" / "__pycache__").mkdir(exist_ok=True)
    (tmp_path / "spawner" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    assert build_hub.inputs_hash("gpuhub/debian-base:x", requirements) in seen


def test_make_images_builds_the_hub_image_too_a_one_host_install_does_not():
    script = (IMAGES / "build-images.sh").read_text()
    assert '[ "$variant" = hub ]' in script and "build_hub.py" in script
    makefile = (REPO / "Makefile").read_text()
    assert "\timages/build-images.sh $(VARIANTS) hub\n" in makefile
    assert " hub" not in (REPO / "hub_config" / "install.sh").read_text().split("build-images.sh", 1)[1].split("\n")[0]
