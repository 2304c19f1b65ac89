"""JupyterLab's load time with and without the in-lab GPU extension (gpuhub-lab), same run.

    python bench/bench_lab_extension.py [--runs 10] [--image gpuhub/notebook-minimal:latest]

Two containers of the same notebook image serve JupyterLab on 127.0.0.1 (a published
port of the harness's dockerd): one as shipped, one with `gpuhub-lab` disabled
(`jupyter labextension disable`, the user's level).  Headless Chromium (Debian's, a
fresh profile per load, so nothing is cached between loads) opens /lab in turn, one
then the other, `--runs` times; a load ends when JupyterLab is idle: the application
restored, the splash gone and the status bar drawn.  Both servers run the
gpuhub_activity server extension; without a hub it answers the status item at once
("not started by the hub's GPU pool"), so this measures what the extension adds to the
page (its bundle, its widgets), not the pool service's answer.  Prints medians and the
ratio (goal: within 1.1x).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from urllib.request import urlopen

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
ARGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-extensions", "--no-first-run", "--no-default-browser-check", "--window-size=1400,1000",
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1")
IDLE = """
const bar = document.querySelector('#jp-main-statusbar');
return !!(window.jupyterapp || bar) && !document.querySelector('#jupyterlab-splash') && !!bar
  && bar.children.length > 0;
"""
LOAD_TIMEOUT = 180


def start_lab(client, image: str, token: str, with_extension: bool):
    script = ("" if with_extension else "jupyter labextension disable gpuhub-lab --level=user >/dev/null && ") + \
        f"exec jupyter lab --ip=0.0.0.0 --port=8888 --no-browser --IdentityProvider.token={token}"
    container = client.containers.run(
        image, ["sh", "-c", script], detach=True, remove=True, ports={"8888/tcp": ("127.0.0.1", None)},
        labels={"org.jupyter.gpuhub.bench": "lab-extension"}, mem_limit="2g", pids_limit=512,
        security_opt=["no-new-privileges"], cap_drop=["ALL"])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        container.reload()
        ports = container.attrs["NetworkSettings"]["Ports"].get("8888/tcp")
        if ports:
            url = f"http://127.0.0.1:{ports[0]['HostPort']}"
            try:
                urlopen(f"{url}/api/status?token={token}", timeout=2).read()
                return container, url
            except OSError:
                pass
        time.sleep(0.5)
    container.kill()
    raise SystemExit(f"JupyterLab in {image} did not answer within 120 s")


def load_once(url: str, token: str) -> float:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="chromium-bench-")
    for arg in ARGS:
        options.add_argument(arg)
    options.add_argument(f"--user-data-dir={profile}")
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER, env={**os.environ, "SE_OFFLINE": "true"}))
    try:
        driver.set_page_load_timeout(LOAD_TIMEOUT)
        start = time.perf_counter()
        driver.get(f"{url}/lab?token={token}")
        WebDriverWait(driver, LOAD_TIMEOUT, poll_frequency=0.05).until(lambda d: d.execute_script(IDLE))
        elapsed = time.perf_counter() - start
        if "gpuhub-status" in driver.page_source:
            elapsed = -elapsed  # marks a load that had the extension (checked below)
        return elapsed
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--image", default="")
    args = parser.parse_args(argv)
    import docker

    client = docker.from_env()
    image = args.image
    if not image:
        import subprocess

        base = subprocess.run(["bash", "images/build-base.sh"], cwd=REPO, check=True, capture_output=True,
                              text=True).stdout.strip().splitlines()[-1]
        image = subprocess.run([sys.executable, "images/build.py", "--variant", "minimal", "--base-image", base],
                               cwd=REPO, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
    token = secrets.token_hex(16)
    labs = {}
    try:
        for name, with_extension in (("with gpuhub-lab", True), ("without", False)):
            labs[name] = start_lab(client, image, token, with_extension)
        times: dict[str, list[float]] = {name: [] for name in labs}
        for _, url in labs.values():
            load_once(url, token)  # a first load of each, not counted (the server's own warm-up)
        for _ in range(args.runs):
            for name, (_, url) in labs.items():
                t = load_once(url, token)
                if (t < 0) != (name == "with gpuhub-lab"):
                    raise SystemExit(f"{name}: the status item was {'' if t < 0 else 'not '}there")
                times[name].append(abs(t))
    finally:
        for container, _ in labs.values():
            with contextlib.suppress(Exception):
                container.kill()
    base = statistics.median(times["without"])
    print(f"\nJupyterLab load (page load to idle), {args.runs} loads each, interleaved, image {image}")
    print(f"{'':<18}{'median s':>10}{'min s':>8}{'max s':>8}{'ratio':>8}")
    for name, values in times.items():
        m = statistics.median(values)
        print(f"{name:<18}{m:>10.2f}{min(values):>8.2f}{max(values):>8.2f}{m / base:>7.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
