#!/usr/bin/env python3
"""Build the hub image (images/hub/Dockerfile) with the classic builder, cached by its inputs.

    python images/build_hub.py --base-image gpuhub/debian-base:latest

What the image holds, and where it comes from:

- this package, as the wheel built here from the repository's sources (pip's build of
  pyproject.toml, with the host's pip settings), with its `postgres` extra, and JupyterHub
  pinned to the version of the hub building it (the notebook images pin the same one);
- every other wheel, fetched by the host's pip for the image's Python into a wheelhouse that
  only the builder stage sees (as images/build.py does for the notebook images);
- configurable-http-proxy's npm packages, installed by the host's npm from the committed
  images/hub/package-lock.json into a cache keyed by the lock file;
- hub_config/jupyterhub_config.py, the one config every deployment loads.

The tag is a hash of all of it (`INPUTS` below, the requirements, the base image's id), so an
unchanged hub image is found, not rebuilt.  Prints the image reference on stdout.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
HUB_DIR = HERE / "hub"

_spec = importlib.util.spec_from_file_location("gpuhub_images_build", HERE / "build.py")
assert _spec and _spec.loader
notebook_build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(notebook_build)

CACHE = notebook_build.CACHE
HASH_LABEL = notebook_build.HASH_LABEL
DISTRIBUTION = "jupyterhub-gpuspawner"
# What the wheel is built from: the package's sources and the files pyproject.toml names.
PACKAGE_INPUTS = ["pyproject.toml", "README.md", "LICENSE", "spawner"]
# The build context's own files (images/hub/), and the deployment's config, copied in.
HUB_FILES = ["Dockerfile", "hub-entrypoint.sh", "package.json", "package-lock.json"]
CONFIG_FILE = REPO / "hub_config" / "jupyterhub_config.py"


def _package_files() -> list[Path]:
    files = []
    for name in PACKAGE_INPUTS:
        path = REPO / name
        if path.is_dir():
            files += [p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                      and p.suffix != ".pyc"]
        else:
            files.append(path)
    return sorted(files)


def input_files() -> list[Path]:
    """Every file whose content goes into the hub image (and so into its tag)."""
    return sorted([HUB_DIR / name for name in HUB_FILES] + [CONFIG_FILE] + _package_files())


def requirements_text() -> str:
    """The image's requirements: this package with PostgreSQL (the Swarm ledger), and the
    hub's JupyterHub version, so the hub and the notebook images speak one protocol."""
    version = metadata.version(DISTRIBUTION)
    return f"{DISTRIBUTION}[postgres]=={version}\njupyterhub=={metadata.version('jupyterhub')}\n"


def inputs_hash(base_image: str, requirements: str) -> str:
    h = hashlib.sha256()
    for path in input_files():
        h.update(str(path.relative_to(REPO)).encode())
        h.update(path.read_bytes())
    h.update(json.dumps({"base": notebook_build.image_id(base_image) or base_image,
                         "requirements": requirements}, sort_keys=True).encode())
    return h.hexdigest()[:16]


def build_wheel(dest: Path) -> Path:
    """This package's wheel, built by the host's pip from a copy of its sources (so the
    build leaves nothing in the checkout)."""
    with tempfile.TemporaryDirectory(prefix="gpuhub-wheel-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        for name in PACKAGE_INPUTS:
            path = REPO / name
            if path.is_dir():
                shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                shutil.copy2(path, src / name)
        notebook_build.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                            "--wheel-dir", str(dest), str(src)], stdout=sys.stderr)
    wheels = sorted(dest.glob("jupyterhub_gpuspawner-*.whl"))
    if len(wheels) != 1:
        raise SystemExit(f"build: expected one wheel of {DISTRIBUTION}, found {[w.name for w in wheels]}")
    return wheels[0]


def fill_chp(cache: Path) -> Path:
    """configurable-http-proxy's node_modules, exactly as images/hub/package-lock.json says,
    installed by the host's npm into a cache keyed by the lock file."""
    return notebook_build.npm_ci_cached(HUB_DIR, cache, "npm-hub", "configurable-http-proxy", "--omit=dev")


def build(base_image: str, repo: str = "gpuhub/hub") -> str:
    """Build (or find) the hub image; builds take turns (a lock file), as the notebook images' do."""
    lock_path = CACHE / "locks" / "build-hub.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build_locked(base_image, repo)


def _build_locked(base_image: str, repo: str) -> str:
    requirements = requirements_text()
    digest = inputs_hash(base_image, requirements)
    ref = f"{repo}:{digest}"
    if notebook_build.image_id(ref):
        notebook_build.log(f"{ref} is up to date ({notebook_build.image_size(ref)})")
        return ref

    context = CACHE / "image-context" / "hub"
    if context.exists():
        shutil.rmtree(context)
    context.mkdir(parents=True)
    wheelhouse = context / "wheelhouse"
    wheelhouse.mkdir()
    build_wheel(wheelhouse)
    python_version = notebook_build.image_python_version(base_image)
    # The dependencies' wheels are cached by what they depend on (not by the package's code).
    dep_key = hashlib.sha256(f"{python_version}\n{requirements}".encode()
                             + (REPO / "pyproject.toml").read_bytes()).hexdigest()[:16]
    dep_cache = CACHE / "wheelhouse" / f"hub-{dep_key}"
    if not (dep_cache / ".complete").exists():
        notebook_build.log(f"fetching the hub's wheels (Python {python_version}) with the host's pip settings")
        dep_cache.mkdir(parents=True, exist_ok=True)
        req = dep_cache / "requirements.txt"
        req.write_text(requirements)
        notebook_build.run([sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(dep_cache),
                            "--only-binary=:all:", "--python-version", python_version,
                            "--find-links", str(wheelhouse), "-r", str(req)])
        req.unlink()
        for own in dep_cache.glob("jupyterhub_gpuspawner-*.whl"):
            own.unlink()  # the package's own wheel is built afresh for every image
        (dep_cache / ".complete").touch()
    for wheel in dep_cache.glob("*.whl"):
        os.link(wheel, wheelhouse / wheel.name)
    (context / "requirements.txt").write_text(requirements)
    for name in HUB_FILES:
        shutil.copy2(HUB_DIR / name, context / name)
    shutil.copy2(CONFIG_FILE, context / "jupyterhub_config.py")
    chp = fill_chp(CACHE)
    (context / "chp").mkdir()
    shutil.copytree(chp / "node_modules", context / "chp" / "node_modules", copy_function=os.link, symlinks=True)

    build_id = f"hub-{digest}-{os.getpid()}"
    cmd = ["docker", "build", "--force-rm", "--tag", ref, "--tag", f"{repo}:latest",
           "--label", f"{HASH_LABEL}={digest}", "--build-arg", f"BASE_IMAGE={base_image}",
           "--build-arg", f"BUILD_ID={build_id}"]
    notebook_build.log(f"docker build {ref}")
    notebook_build.run(cmd + [str(context)], env={**os.environ, "DOCKER_BUILDKIT": "0"}, stdout=sys.stderr)
    subprocess.run(["docker", "image", "prune", "--force", "--filter", "label=org.jupyter.gpuhub.stage=builder",
                    "--filter", f"label=org.jupyter.gpuhub.build-id={build_id}"], capture_output=True)
    shutil.rmtree(context)
    notebook_build.log(f"built {ref} ({notebook_build.image_size(ref)})")
    return ref


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-image", default=os.environ.get("BASE_IMAGE", "gpuhub/debian-base:latest"))
    parser.add_argument("--repo", default="gpuhub/hub")
    args = parser.parse_args(argv)
    print(build(args.base_image, args.repo))
    return 0


if __name__ == "__main__":
    sys.exit(main())
