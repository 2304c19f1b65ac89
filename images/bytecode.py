#!/usr/bin/env python3
"""Ship bytecode for what users import: runs in the Dockerfile's builder stage.

    python3 bytecode.py --mode warmup|all|none /opt/notebook

The notebook user cannot write into /opt/notebook, so without bytecode every
server start and every kernel that imports TensorFlow compiles thousands of
modules again (about 2 s per spawn, 10 s per TensorFlow kernel).

- `warmup` (the default): run what a user's first minute runs (JupyterLab
  started and its page and settings served, jupyterhub-singleuser's modules, a
  kernel started through the server and a TensorFlow cell run in it), keep
  the list of modules that were compiled, and ship bytecode for exactly those.
  That is the speed of a fully compiled environment for the first minute at
  a fraction of its size.
- `all`: compile every module of the environment.
- `none`: no bytecode (the images before bytecode shipped).

Bytecode is written with `--invalidation-mode unchecked-hash`: the .pyc files
hold a hash of their source instead of its modification time, so two builds
of the same inputs give the same files, and Python never rereads the source
to check it (the environment is read-only for the user).

Whatever the warm-up leaves inside the environment apart from bytecode
(runtime files, caches) is removed, and listed on stderr.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import py_compile
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

TAG = f"cpython-{sys.version_info.major}{sys.version_info.minor}"

# What a user's first minute imports in the kernel (each guarded: the minimal
# image has no TensorFlow).
KERNEL_CELLS = [
    "import numpy",
    "import tensorflow as tf; tf.reduce_sum(tf.ones((1000, 1000)))",
    "import keras",
    "import sklearn.datasets, PIL.Image",
    "import matplotlib",
]

# jupyterhub-singleuser's own modules: the hub-facing side of the server,
# which a plain `jupyter lab` below does not load.
SINGLEUSER_IMPORTS = (
    "import jupyterhub.singleuser, jupyterhub.singleuser.app, jupyterhub.singleuser.extension, "
    "jupyterhub.services.auth, jupyterhub.utils"
)


def log(msg: str) -> None:
    print(f"bytecode: {msg}", file=sys.stderr, flush=True)


def pycache_dirs(root: Path) -> list[Path]:
    return [p for p in root.rglob("__pycache__") if p.is_dir()]


def remove_bytecode(root: Path) -> None:
    for d in pycache_dirs(root):
        shutil.rmtree(d, ignore_errors=True)


def compiled_sources(root: Path) -> list[Path]:
    """Source files that have a .pyc of this Python in their __pycache__."""
    sources = []
    for d in pycache_dirs(root):
        for pyc in d.glob(f"*.{TAG}*.pyc"):
            name = pyc.name.split(f".{TAG}")[0] + ".py"
            src = d.parent / name
            if src.is_file():
                sources.append(src)
    return sorted(set(sources))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url: str, method: str = "GET", body: dict | None = None, timeout: float = 10) -> dict | str:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        text = r.read().decode()
    try:
        return json.loads(text)
    except ValueError:
        return text


def warm_up(python: str, workdir: Path) -> None:
    """Run a first minute: the server, its page, a kernel, the TensorFlow cell."""
    env = {**os.environ, "HOME": str(workdir), "JUPYTER_RUNTIME_DIR": str(workdir / "runtime"),
           "JUPYTER_CONFIG_DIR": str(workdir / "config"), "JUPYTER_DATA_DIR": str(workdir / "data"),
           "IPYTHONDIR": str(workdir / "ipython"), "PYTHONDONTWRITEBYTECODE": ""}
    env.pop("PYTHONDONTWRITEBYTECODE")
    subprocess.run([python, "-c", SINGLEUSER_IMPORTS], env=env, check=True)

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [python, "-m", "jupyterlab", "--no-browser", "--allow-root", "--ServerApp.ip=127.0.0.1",
         f"--ServerApp.port={port}",
         "--IdentityProvider.token=", "--ServerApp.password=", "--ServerApp.disable_check_xsrf=True",
         f"--ServerApp.root_dir={workdir}"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                http(f"{base}/api/status", timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the warm-up server did not start:\n"
                                       + server.stderr.read().decode(errors="replace")[-3000:]) from None
                time.sleep(0.3)
        # What the browser asks for first.
        for path in ("/lab", "/lab/api/settings", "/api/sessions", "/api/kernelspecs",
                     "/api/contents", "/api/terminals", "/lab/api/workspaces"):
            try:
                http(base + path)
            except OSError as exc:
                log(f"warm-up GET {path}: {exc}")
        kernel = http(f"{base}/api/kernels", "POST", {"name": "python3"}, timeout=120)
        run_cells(python, env, workdir / "runtime" / f"kernel-{kernel['id']}.json")
        http(f"{base}/api/kernels/{kernel['id']}", "DELETE", timeout=60)
    finally:
        server.terminate()
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()


RUN_CELLS = r"""
import sys
from jupyter_client import BlockingKernelClient
kc = BlockingKernelClient(connection_file=sys.argv[1])
kc.load_connection_file()
# No heartbeat: on a loaded build machine a missed 1 s beat read as "Kernel died before
# replying to kernel_info"; the kernel's own reply (within the timeout) is what counts.
kc.start_channels(hb=False)
kc.wait_for_ready(timeout=120)
for cell in sys.argv[2:]:
    code = "try:\n    " + cell + "\nexcept ImportError:\n    pass"
    reply = kc.execute_interactive(code, timeout=300, output_hook=lambda msg: None)
    print("warm-up cell:", cell, "->", reply["content"]["status"], file=sys.stderr)
kc.stop_channels()
"""


def run_cells(python: str, env: dict, connection_file: Path) -> None:
    subprocess.run([python, "-c", RUN_CELLS, str(connection_file), *KERNEL_CELLS], env=env, check=True,
                   timeout=600)


def compile_files(files: list[Path], workers: int) -> None:
    mode = py_compile.PycInvalidationMode.UNCHECKED_HASH
    if workers > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(workers) as pool:
            list(pool.map(_compile_one, files, chunksize=64))
    else:
        for f in files:
            py_compile.compile(str(f), doraise=False, invalidation_mode=mode, quiet=1)


def _compile_one(path: Path) -> None:
    py_compile.compile(str(path), doraise=False, quiet=1,
                       invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)


def du(paths) -> int:
    total = 0
    for d in paths:
        for f in d.rglob("*"):
            if f.is_file():
                total += f.stat().st_size
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["warmup", "all", "none"], default="warmup")
    parser.add_argument("prefix", type=Path, help="the environment (e.g. /opt/notebook)")
    args = parser.parse_args()
    prefix: Path = args.prefix
    python = str(prefix / "bin" / "python")
    workers = os.cpu_count() or 1

    # pip compiled everything with timestamps: start from no bytecode at all.
    remove_bytecode(prefix)
    if args.mode == "none":
        log("no bytecode shipped")
        return 0
    if args.mode == "all":
        ok = compileall.compile_dir(str(prefix), quiet=2, workers=workers,
                                    invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
        log(f"compiled every module: {du(pycache_dirs(prefix)) / 1e6:.1f} MB of bytecode")
        return 0 if ok else 1

    before = {p for p in prefix.rglob("*") if "__pycache__" not in p.parts}
    with tempfile.TemporaryDirectory(prefix="warmup-") as tmp:
        warm_up(python, Path(tmp))
    # Nothing but bytecode may stay behind in the environment.
    for p in sorted({p for p in prefix.rglob("*") if "__pycache__" not in p.parts} - before, reverse=True):
        log(f"removing what the warm-up left: {p}")
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    sources = compiled_sources(prefix)
    remove_bytecode(prefix)
    compile_files(sources, workers)
    log(f"compiled the {len(sources)} modules a first minute imports: "
        f"{du(pycache_dirs(prefix)) / 1e6:.1f} MB of bytecode")
    return 0


if __name__ == "__main__":
    sys.exit(main())
