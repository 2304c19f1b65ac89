#!/usr/bin/env python3
"""Build a notebook image with the classic Docker builder, cached by its inputs.

    python images/build.py --variant minimal --base-image gpuhub/debian-base:latest

Python packages are fetched on the host by the host's own pip (its index,
mirrors, CA bundle and proxy settings all apply) into a wheelhouse that only
the builder stage sees; the in-lab extension's npm packages likewise by the
host's own npm (its registry, CA file, proxy), from the committed lock file,
into jupyter/labextension/node_modules of the build context.  Neither
configuration ever enters the context.  The image tag is a hash of every input (Dockerfile,
requirements, variant, base image id, the hub's JupyterHub version), so an
unchanged image is never rebuilt.  Prints the image reference on stdout.
"""

from __future__ import annotations

import argparse
import ast
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("GPUHUB_CACHE", HERE.parent / ".cache"))
HASH_LABEL = "org.jupyter.gpuhub.inputs-hash"

# What each variant adds on top of JupyterLab + jupyterhub-singleuser, and
# fixed build args.  `workflow` variants also get images/workflow/ (train.py,
# predict.py, the starter notebook) in their skel.  The TensorFlow and CUDA
# labels are not written here: build.py reads them from the wheels it fetched
# (see wheel_labels), so they cannot drift from what the image contains.
VARIANTS: dict[str, dict] = {
    "minimal": {"requirements": ["minimal.txt"], "build_args": {}},
    "mkl": {"requirements": ["minimal.txt", "workflow.txt", "mkl.txt"], "build_args": {},
            "workflow": True},
    "cuda": {"requirements": ["minimal.txt", "workflow.txt", "cuda.txt"], "build_args": {},
             "workflow": True},
}


def log(msg: str) -> None:
    print(f"build: {msg}", file=sys.stderr, flush=True)


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, **kw)


def requirements_text(variant: str) -> str:
    """The variant's requirements, with JupyterHub pinned to the hub's version
    so the single-user server always speaks the hub's protocol."""
    lines = [f"jupyterhub=={metadata.version('jupyterhub')}"]
    for name in VARIANTS[variant]["requirements"]:
        lines.append((HERE / "requirements" / name).read_text())
    return "\n".join(lines) + "\n"


def image_id(ref: str) -> str | None:
    out = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", ref],
                         capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else None


WORKFLOW_DIR = HERE / "workflow"
# Where the workflow lands inside the skel, i.e. in the user's home.
WORKFLOW_SKEL = "tensorflow-examples"


def workflow_files() -> list[Path]:
    return sorted(p for p in WORKFLOW_DIR.rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")


# Files and folders of images/ copied into every build context.
CONTEXT_FILES = ["Dockerfile", "start-notebook.sh", "start-sshd.sh", "bytecode.py"]
CONTEXT_DIRS = ["skel", "jupyter"]
BYTECODE_MODES = ("warmup", "all", "none")
# What a local build of the in-lab extension leaves (never committed, never an input: the
# image builds its own from the sources and the lock file).
BUILD_OUTPUTS = ("__pycache__", "node_modules", "lib", "build", "tsconfig.tsbuildinfo", "*.egg-info",
                 # what linters and test runners leave beside the sources (ruff reads images/jupyter/pyproject.toml)
                 ".ruff_cache", ".pytest_cache", ".mypy_cache")
LABEXTENSION = HERE / "jupyter" / "labextension"
# Installed in the builder stage's pip build environment only (the images' own package is
# built with it), so fetched into the wheelhouse but not in requirements.txt.
BUILD_REQUIREMENTS = "hatchling>=1.21\n"


def _is_output(path: Path) -> bool:
    rel = path.relative_to(HERE).parts
    return path.suffix == ".pyc" or any(Path(part).match(pattern) for part in rel for pattern in BUILD_OUTPUTS)


def _context_paths() -> list[Path]:
    paths = [HERE / name for name in CONTEXT_FILES]
    for name in CONTEXT_DIRS:
        paths += [p for p in (HERE / name).rglob("*") if not _is_output(p)]
    return sorted(paths)


def npm_ci_cached(package_dir: Path, cache: Path, cache_name: str, what: str, *npm_args: str) -> Path:
    """`npm ci` of package_dir's package.json and lock file by the host's npm (its own registry
    and TLS settings; no install scripts), into a cache folder keyed by those two files;
    returns that folder.  `what` names the packages in messages."""
    lock = package_dir / "package-lock.json"
    key = hashlib.sha256((package_dir / "package.json").read_bytes() + lock.read_bytes()).hexdigest()[:16]
    target = cache / cache_name / key
    if not (target / ".complete").exists():
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        shutil.copy2(package_dir / "package.json", target)
        shutil.copy2(lock, target)
        if shutil.which("npm") is None:
            raise SystemExit(f"build: npm is needed on the host to fetch {what} "
                             "(with the host's own npm settings); install Node.js and npm")
        log(f"fetching {what} with the host's npm settings")
        run(["npm", "ci", *npm_args, "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=target, stdout=sys.stderr)
        (target / ".complete").touch()
    return target


def fill_node_modules(cache: Path) -> Path:
    """The in-lab extension's npm packages, exactly as its lock file says (see npm_ci_cached);
    returns that node_modules folder.  They are only read by the TypeScript compiler and the
    JupyterLab builder in the image build."""
    return npm_ci_cached(LABEXTENSION, cache, "npm", "the JupyterLab extension's npm packages") / "node_modules"


def inputs_hash(variant: str, base_image: str, requirements: str, bytecode: str = "warmup") -> str:
    h = hashlib.sha256()
    for path in _context_paths():
        if path.is_file():
            h.update(str(path.relative_to(HERE)).encode())
            h.update(path.read_bytes())
    if VARIANTS[variant].get("workflow"):
        for path in workflow_files():
            h.update(f"workflow/{path.relative_to(WORKFLOW_DIR)}".encode())
            h.update(path.read_bytes())
    h.update(json.dumps({
        "variant": variant,
        "base": image_id(base_image) or base_image,
        "requirements": requirements,
        "build_args": VARIANTS[variant]["build_args"],
        **({"bytecode": bytecode} if bytecode != "warmup" else {}),
    }, sort_keys=True).encode())
    return h.hexdigest()[:16]


def image_python_version(base_image: str) -> str:
    """The Python version inside the base image (wheels must fit it, not the host)."""
    out = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--entrypoint", "python3", base_image,
         "-c", "import platform; print(platform.python_version())"],
        capture_output=True, text=True)
    if out.returncode != 0:
        # A stock image without Python installs Debian's at build time.
        return "3.11.2"
    return out.stdout.strip()


def fill_wheelhouse(requirements: str, python_version: str, wheelhouse: Path) -> None:
    """Fetch wheels for everything in `requirements` with the host's pip, for
    the image's Python (which need not be the host's)."""
    wheelhouse.mkdir(parents=True, exist_ok=True)
    req = wheelhouse / "requirements.txt"
    req.write_text(requirements + BUILD_REQUIREMENTS)
    # Binary wheels only: the builder stage then needs no compiler and no network.
    run([sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(wheelhouse),
         "--only-binary=:all:", "--python-version", python_version, "-r", str(req)])
    req.unlink()


def _major_minor(version: str) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", version)
    if not m:
        raise ValueError(f"not a CUDA version: {version!r}")
    return int(m.group(1)), int(m.group(2))


def tf_build_info(wheel: Path) -> dict:
    """tf.sysconfig.get_build_info() of a TensorFlow wheel, read from the wheel
    itself (tensorflow/python/platform/build_info.py) without installing it."""
    with zipfile.ZipFile(wheel) as zf:
        source = zf.read("tensorflow/python/platform/build_info.py").decode()
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "build_info" for t in node.targets)
                and isinstance(node.value, ast.Call) and node.value.args):
            return dict(ast.literal_eval(node.value.args[0]))
    raise ValueError(f"{wheel.name}: no build_info in tensorflow/python/platform/build_info.py")


def wheel_labels(wheelhouse: Path) -> dict[str, str]:
    """TF_VERSION and CUDA_VERSION build args (the image's labels) from the wheels.

    CUDA_VERSION is the CUDA the host driver must support, as major.minor: the
    newer of the CUDA TensorFlow was built with and the CUDA runtime wheel
    shipped beside it; "none" for a CPU-only build.  Variants without
    TensorFlow get no values (the Dockerfile's defaults, "none")."""
    tf_wheels = [w for w in wheelhouse.glob("*.whl") if re.match(r"tensorflow(_cpu)?-\d", w.name)]
    if not tf_wheels:
        return {}
    if len(tf_wheels) > 1:
        raise ValueError(f"more than one TensorFlow wheel in the wheelhouse: {[w.name for w in tf_wheels]}")
    wheel = tf_wheels[0]
    labels = {"TF_VERSION": wheel.name.split("-")[1], "CUDA_VERSION": "none"}
    info = tf_build_info(wheel)
    if info.get("is_cuda_build"):
        needed = [_major_minor(str(info["cuda_version"]))]
        for runtime in wheelhouse.glob("nvidia_cuda_runtime_cu*-*.whl"):
            needed.append(_major_minor(runtime.name.split("-")[1]))
        labels["CUDA_VERSION"] = "{}.{}".format(*max(needed))
    return labels


def image_size(ref: str) -> str:
    out = subprocess.run(["docker", "image", "inspect", "--format", "{{.Size}}", ref],
                         capture_output=True, text=True)
    return f"{int(out.stdout) / 1e9:.2f} GB" if out.returncode == 0 else "?"


def build(variant: str, base_image: str, repo: str, bytecode: str = "warmup") -> str:
    """Build (or find) the image; `bytecode` other than "warmup" is for
    measurements: such an image gets no :latest tag.

    Builds of one variant take turns (a lock file): test workers running side
    by side share the build context directory, and the second finds the image."""
    lock_path = CACHE / "locks" / f"build-{variant}.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build_locked(variant, base_image, repo, bytecode)


def _build_locked(variant: str, base_image: str, repo: str, bytecode: str) -> str:
    requirements = requirements_text(variant)
    digest = inputs_hash(variant, base_image, requirements, bytecode)
    ref = f"{repo}-{variant}:{digest}"
    if image_id(ref):
        log(f"{ref} is up to date ({image_size(ref)})")
        return ref

    context = CACHE / "image-context" / variant
    if context.exists():
        shutil.rmtree(context)
    context.mkdir(parents=True)
    python_version = image_python_version(base_image)
    wheel_key = hashlib.sha256(f"{python_version}\n{requirements}{BUILD_REQUIREMENTS}".encode()).hexdigest()[:16]
    wheel_cache = CACHE / "wheelhouse" / wheel_key
    if not (wheel_cache / ".complete").exists():
        log(f"fetching wheels for {variant} (Python {python_version}) with the host's pip settings")
        fill_wheelhouse(requirements, python_version, wheel_cache)
        (wheel_cache / ".complete").touch()
    shutil.copytree(wheel_cache, context / "wheelhouse", copy_function=os.link,
                    ignore=shutil.ignore_patterns(".complete"))
    (context / "requirements.txt").write_text(requirements)
    for name in CONTEXT_FILES:
        shutil.copy2(HERE / name, context / name)
    for name in CONTEXT_DIRS:
        shutil.copytree(HERE / name, context / name, ignore=shutil.ignore_patterns(*BUILD_OUTPUTS, "*.pyc"))
    shutil.copytree(fill_node_modules(CACHE), context / "jupyter" / "labextension" / "node_modules",
                    copy_function=os.link, symlinks=True)
    if VARIANTS[variant].get("workflow"):
        # The workflow goes into the skel: the image keeps a pristine copy under
        # /opt/gpuhub/skel, and start-notebook.sh copies it to the user's home.
        target = context / "skel" / WORKFLOW_SKEL
        target.mkdir(parents=True, exist_ok=True)
        for path in workflow_files():
            dest = target / path.relative_to(WORKFLOW_DIR)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest)

    build_id = f"{digest}-{os.getpid()}"
    args = {"BASE_IMAGE": base_image, "VARIANT": variant, "BYTECODE": bytecode, "BUILD_ID": build_id,
            **VARIANTS[variant]["build_args"], **wheel_labels(context / "wheelhouse")}
    # --force-rm: a failed step's container (it may hold the wheelhouse) goes too.
    cmd = ["docker", "build", "--force-rm", "--tag", ref, "--label", f"{HASH_LABEL}={digest}"]
    if bytecode == "warmup":
        cmd += ["--tag", f"{repo}-{variant}:latest"]
    for key, value in args.items():
        cmd += ["--build-arg", f"{key}={value}"]
    log(f"docker build {ref}")
    # Classic builder: DOCKER_BUILDKIT=0 so no BuildKit feature can creep in.
    run(cmd + [str(context)], env={**os.environ, "DOCKER_BUILDKIT": "0"},
        stdout=sys.stderr)
    # Drop this build's dangling builder stage (it holds the wheelhouse); a
    # filter on the stage label alone would also remove the half-built stage
    # of a build running beside this one.
    subprocess.run(["docker", "image", "prune", "--force", "--filter", "label=org.jupyter.gpuhub.stage=builder",
                    "--filter", f"label=org.jupyter.gpuhub.build-id={build_id}"], capture_output=True)
    shutil.rmtree(context)
    log(f"built {ref} ({image_size(ref)}; tensorflow {args.get('TF_VERSION', 'none')}, "
        f"cuda {args.get('CUDA_VERSION', 'none')})")
    return ref


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=sorted(VARIANTS), default="minimal")
    parser.add_argument("--base-image", default=os.environ.get("BASE_IMAGE", "gpuhub/debian-base:latest"))
    parser.add_argument("--repo", default="gpuhub/notebook")
    parser.add_argument("--bytecode", choices=BYTECODE_MODES, default="warmup",
                        help="bytecode shipped: for the first minute's modules (default), all, or none "
                             "(for measurements; such images get no :latest tag)")
    args = parser.parse_args(argv)
    print(build(args.variant, args.base_image, args.repo, args.bytecode))
    return 0


if __name__ == "__main__":
    sys.exit(main())
