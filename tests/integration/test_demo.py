"""`make demo` as a newcomer runs it (issue 36, item 1): devservices/demo.py started as a
process, its banner read, and each line of it tried: every URL answers, the SSH line logs in
with OpenSSH's `ssh` and alice's demo password, carol runs an action script in alice's server
through the pool page's API, and the bookings answer with the demo's small limits (and one of
the newcomer's own `--config`).

The demo runs on free ports, on the suite's Docker network, with its containers and volumes
under a prefix of its own: given as GPUHUB_* variables, which the demo applies over its own
settings (the way a newcomer changes one).  Bounded: the banner within BANNER_TIMEOUT (the
images are cached by the suite), each step with its own timeout, the stop within 180 s.
"""

from __future__ import annotations

import os
import queue
import re
import secrets
import signal
import subprocess
import sys
import threading
import time

import requests

from devservices.hub import REPO, remove_what_a_hub_made
from devservices.ldap import seed
from devservices.ports import free_port
from devservices.ssh_client import SSHClient

# The first run builds the demo's images (cached by the hash of their inputs); the suite's
# image fixtures have built them already.
BANNER_TIMEOUT = 900


def four_free_ports() -> int:
    """A port p with p..p+3 free (the hub, its proxy's API, the pool page, the SSH key page)."""
    import socket

    for _ in range(50):
        base = free_port()
        ok = True
        for port in range(base, base + 4):
            with socket.socket() as sock:
                sock.settimeout(0.2)
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    ok = False
        if ok and base + 3 < 65536:
            return base
    raise RuntimeError("no four free ports in a row")


class Banner:
    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, text: str, timeout: float) -> list[str]:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {text!r} from the demo in {timeout} s:\n" + "\n".join(self.lines[-40:]))
            try:
                line = self._queue.get(timeout=min(left, 5))
            except queue.Empty:
                continue
            if line is None:
                raise AssertionError(f"the demo exited ({self.proc.wait()}):\n" + "\n".join(self.lines[-40:]))
            self.lines.append(line)
            if text in line:
                return self.lines


def log_in(hub: str, name: str, password: str) -> requests.Session:
    """The hub's login form, as a browser fills it."""
    session = requests.Session()
    session.get(f"{hub}/hub/login", timeout=30)
    r = session.post(f"{hub}/hub/login", timeout=60, data={
        "username": name, "password": password, "_xsrf": session.cookies.get("_xsrf")})
    assert r.status_code == 200 and "/hub/login" not in r.url, (r.url, r.text[:300])
    return session


def test_each_line_of_the_demos_banner_works(tmp_path, docker_client, hub_network):
    port, ssh_port = four_free_ports(), free_port()
    prefix = f"gpuhub-demotest-{secrets.token_hex(3)}"
    env = {**os.environ,
           # A newcomer's own settings, over the demo's: here, what keeps this demo apart from others.
           "GPUHUB_DOCKER_NETWORK": hub_network.name, "GPUHUB_CONTAINER_PREFIX": prefix,
           "GPUHUB_HOME_VOLUME": f"{prefix}-home-{{username}}", "GPUHUB_HUB_PORT": str(free_port()),
           "GPUHUB_LEASE_WAIT_TIMEOUT": "60"}
    # ...and a config file of their own, loaded after the demo's.
    mine = tmp_path / "my_demo.py"
    mine.write_text("c.GPUPool.booking_max_per_user = 2\n")
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "devservices" / "demo.py"), "--dir", str(tmp_path / "demo"),
         "--port", str(port), "--ssh-port", str(ssh_port), "--config", str(mine),
         "--ldap-port", str(free_port()), "--ldaps-port", str(free_port())],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        text=True, start_new_session=True)
    try:
        banner = Banner(proc)
        lines = banner.wait_for("Ctrl-C stops", BANNER_TIMEOUT)
        text = "\n".join(lines)
        assert f"your setting: GPUHUB_CONTAINER_PREFIX={prefix}" in text
        for feature in ("Start a server:", "Pool page:", "Bookings:", "Jobs:", "Action scripts:", "SSH:"):
            assert any(feature in line for line in lines), f"no {feature} line in the banner:\n{text}"

        # Every URL of the banner answers (a page, or the hub's login page it sends you to).
        urls = sorted(set(re.findall(r"http://127\.0\.0\.1:\d+[^\s,;)]*", text)))
        assert f"http://127.0.0.1:{port}/services/gpu-pool/" in urls
        for url in urls:
            r = requests.get(url, timeout=30)
            assert r.status_code == 200, (url, r.status_code, r.text[:300])

        # The SSH line, as printed, with OpenSSH's client and the password it names.
        ssh_line = next(line for line in lines if "SSH: ssh -p" in line)
        m = re.search(r"ssh -p (\d+) (\w+)@127\.0\.0\.1 \(password ([^;]+);", ssh_line)
        assert m and int(m.group(1)) == ssh_port, ssh_line
        user, password = m.group(2), m.group(3)
        assert password == seed.users_for("openldap")[user].password
        hub = f"http://127.0.0.1:{port}"
        log_in(hub, user, password)  # the SSH line's "once alice has logged in" (the gateway says so before)
        result = SSHClient(ssh_port, tmp_path / "ssh").ssh(user, "echo demo-ssh-ok; whoami", password=password,
                                                            timeout=300)
        assert result.returncode == 0 and "demo-ssh-ok" in result.stdout, (result.stdout, result.stderr)
        assert user in result.stdout

        # carol (the banner's action-script runner) runs one in alice's server, by the pool page's API.
        carol = seed.users_for("openldap")["carol"]
        assert "log in as carol" in next(line for line in lines if "Action scripts:" in line)
        session = log_in(hub, carol.name, carol.password)
        r = session.post(f"{hub}/hub/api/users/carol/tokens", json={"note": "demo test", "expires_in": 600},
                         headers={"X-XSRFToken": session.cookies.get("_xsrf")}, timeout=30)
        assert r.status_code == 201, r.text
        auth = {"Authorization": f"token {r.json()['token']}"}
        r = requests.post(f"{hub}/services/gpu-pool/api/exec", headers=auth, timeout=120,
                          json={"script": "echo ran-by-carol", "timeout": 30, "users": [user]})
        assert r.status_code == 200, r.text
        results = r.json()["results"]
        assert [x["exit_code"] for x in results] == [0] and "ran-by-carol" in results[0]["output"], results

        # The bookings answer with the demo's limits (an hour at most, a minute's notice), and --config's.
        limits = requests.get(f"{hub}/services/gpu-pool/api/bookings", headers=auth, timeout=30).json()["limits"]
        assert limits["max_hours"] == 1.0 and limits["notice_s"] == 60.0, limits
        assert limits["max_per_user"] == 2, limits
        # ...and the GPU-hour budget the banner names, as the pool page shows it.
        budgets = requests.get(f"{hub}/services/gpu-pool/api/wait", headers=auth, timeout=30).json()["budgets"]
        assert [b["limit_gpu_hours"] for b in budgets] == [0.25], budgets
        assert "0.25 GPU-hours per 1 h" in next(line for line in lines if "Pool page:" in line)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGINT)
            try:
                proc.wait(180)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        remove_what_a_hub_made(docker_client, prefix, hub_network.name, [int(env["GPUHUB_HUB_PORT"]), port + 2, port])
    assert proc.returncode == 0, "\n".join(banner.lines[-30:])

