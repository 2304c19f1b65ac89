#!/usr/bin/env python3
"""`make demo`: the hub on http://127.0.0.1:8000 with a demo directory and 4 GPUs.

    .venv/bin/python devservices/demo.py

What it does, in order:

1. installs what is missing: configurable-http-proxy (npm), a Docker engine
   (devservices/docker-up.sh), slapd (Debian's package, by the harness);
2. builds the notebook images it needs, each cached by the hash of its inputs
   (a second run builds nothing): the Debian base, the TensorFlow MKL image,
   and the CUDA image only when NVML finds a GPU;
3. starts a seeded OpenLDAP directory on 127.0.0.1:3890 (StartTLS) / 6360 (LDAPS);
4. starts a mail sink (devservices/mail_sink.py: SMTP on 127.0.0.1:2525 and a page
   listing what it received on 127.0.0.1:8025) as the hub's SMTP server, so the
   notification mails (ready after a wait in the queue, job ended, cull warnings)
   can be read there;
5. starts the hub with hub_config/jupyterhub_config.py -- the production config,
   driven by GPUHUB_* variables -- on the machine's NVML GPUs, or 4 simulated
   GPUs when there is none; its data (database, GPU ledger, cookie secret,
   auth-state key) lives under .demo/ and is reused by the next run.  Every
   feature is on: the pool page, jobs, the SSH gateway on 127.0.0.1, action
   scripts for carol (the directory group `script-runners`), bookings and a
   GPU-hour budget with limits small enough to see in a minute (DEMO_POOL,
   in .demo/jupyterhub_config.py, which loads the production config first);
6. prints the URL, the demo logins and where to find each feature, and waits.

Your own GPUHUB_* variables (`GPUHUB_SSH=false make demo`, ...) are applied over
the demo's settings, and `--config FILE` is loaded after the demo's config
(c.GPUPool.booking_max_hours = 4, ...); docs/demo.md lists both.

Ctrl-C (or SIGTERM) stops what it started, and only that, by pid: the hub
(which stops the notebook servers it runs and its proxy), then the mail sink and
the directory.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from devservices.ldap import openldap as ldap_harness  # noqa: E402
from devservices.ldap import seed  # noqa: E402

PY = sys.executable
SIMULATED_GPUS = 4
# The demo's pool limits (c.GPUPool), small enough to see each at work within a minute or two:
# a booking of GPUs in use starts a minute after it is made (the holders are told), a no-show's
# GPUs go back after two, and each user may use a quarter of a GPU-hour in any hour.
DEMO_POOL = {
    "booking_max_hours": 1.0,
    "booking_max_days_ahead": 1.0,
    "booking_max_gpu_hours_per_week": 4.0,
    "booking_max_per_user": 3,
    "booking_notice": 60.0,
    "booking_grace": 120.0,
    "budget_period": 3600.0,
}
# Each user's share of the GPUs (GPUHUB_MAX_GPUS_PER_USER): beyond it, a job or a server whose
# profile may borrow runs on idle GPUs, given back with notice when someone within theirs asks.
DEMO_SHARE_GPUS = 2
# The production profiles, and one that may borrow (the demo shows borrowing on its own).
DEMO_BORROW_PROFILE = {
    "slug": "tf-gpu-1-borrow",
    "display_name": "TensorFlow + 1 GPU (may borrow)",
    "description": "One GPU; past your share, an idle one lent until someone within theirs needs it.",
    "gpus": 1,
    "cpu_limit": 2.0,
    "mem_limit": "8G",
    "borrow": True,
}
DEMO_BUDGET_GPU_HOURS = "0.25"  # GPUHUB_GPU_HOUR_BUDGET: per user, per DEMO_POOL["budget_period"]
# A "ready" mail after a wait in the queue of this many seconds (the hub's default: 30).
DEMO_READY_AFTER = 5.0
DEMO_MAIL_FROM = "GPU hub demo <gpu-hub@gpuhub.test>"


def say(msg: str) -> None:
    print(f"demo: {msg}", flush=True)


class DemoError(RuntimeError):
    """Something the person running the demo must fix; the message says what."""


# ------------------------------------------------------------------ checks

def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def ensure_proxy() -> None:
    if shutil.which("configurable-http-proxy"):
        return
    if not shutil.which("npm"):
        raise DemoError("configurable-http-proxy is missing and npm is not installed: "
                        "install Node.js and npm, then run `make demo` again")
    say("installing configurable-http-proxy (npm install -g)")
    subprocess.run(["npm", "install", "-g", "--silent", "configurable-http-proxy"], check=False)
    if not shutil.which("configurable-http-proxy"):
        raise DemoError("`npm install -g configurable-http-proxy` did not put it on PATH")


def ensure_docker() -> None:
    if subprocess.run(["docker", "info"], capture_output=True).returncode == 0:
        return
    say("starting a Docker engine (devservices/docker-up.sh)")
    if subprocess.run(["bash", str(REPO / "devservices" / "docker-up.sh")]).returncode != 0:
        raise DemoError("no Docker engine answers and devservices/docker-up.sh could not start one")


def nvml_gpu_count() -> int:
    """GPUs NVML sees on this machine; 0 without a driver or a GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return 0


# ------------------------------------------------------------------ images

def _last_line(cmd: list[str], what: str) -> str:
    # The build scripts print progress on stderr (shown as it comes) and the
    # image reference as the last line of stdout.
    proc = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise DemoError(f"{what} failed (exit {proc.returncode}); its messages are above")
    return proc.stdout.strip().splitlines()[-1]


def build_images(gpus: int) -> tuple[str, str]:
    """(CPU image, GPU image) references, built here when their inputs changed."""
    base = _last_line(["bash", "images/build-base.sh"], "images/build-base.sh")
    help_text = subprocess.run([PY, "images/build.py", "--help"], cwd=REPO,
                               capture_output=True, text=True).stdout
    cpu_variant = "mkl"
    if "mkl" not in help_text:
        cpu_variant = "minimal"
        say("images/build.py has no `mkl` variant yet: using the minimal JupyterLab image "
            "(no TensorFlow) for every profile")
    say(f"image: {cpu_variant} (cached by the hash of its inputs; the first build takes a while)")
    cpu = _last_line([PY, "images/build.py", "--variant", cpu_variant, "--base-image", base],
                     f"images/build.py --variant {cpu_variant}")
    if gpus and cpu_variant == "mkl":
        say("image: cuda (NVML found a GPU)")
        gpu = _last_line([PY, "images/build.py", "--variant", "cuda", "--base-image", base],
                         "images/build.py --variant cuda")
    else:
        # Simulated GPUs run the CPU image: the profiles and leases behave as
        # on a GPU host, TensorFlow runs on the CPU.
        gpu = cpu
    return cpu, gpu


# ------------------------------------------------------------------ secrets

def persistent_secret(path: Path, make) -> str:
    """Read a secret kept under .demo/, or create it (mode 0600) on the first run."""
    if path.exists():
        return path.read_text().strip()
    value = make()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(value + "\n")
    return value


# ------------------------------------------------------------------ processes

class Demo:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.dir = args.dir.resolve()
        self.hub_dir = self.dir / "hub"
        self.ldap: subprocess.Popen | None = None
        self.hub: subprocess.Popen | None = None
        self.mail = None  # the mail sink (devservices/mail_sink.py), once started
        self.launcher: list[str] = []  # a prefix for the hub's command (demo_swarm: its network namespace)
        self.stopping = False
        # The hub's own children (proxy, idle culler), seen while it ran, as
        # (pid, start time): if the hub dies without stopping them, they are
        # still this demo's to stop, and the start time guards against pid reuse.
        self.hub_children: set[tuple[int, str]] = set()
        self.settings: dict[str, str] = {}  # the hub's environment, once made

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.args.port}"

    def preflight(self) -> None:
        for port, what in ((self.args.port, "the hub"), (self.args.port + 1, "the proxy's API"),
                           (self.args.port + 2, "the pool page"), (self.args.port + 3, "the SSH key page"),
                           (self.args.ssh_port, "the SSH gateway"),
                           (self.args.smtp_port, "the mail sink's SMTP"),
                           (self.args.mail_port, "the mail sink's page"),
                           (self.args.ldap_port, "the directory"),
                           (self.args.ldaps_port, "the directory (LDAPS)")):
            if port_in_use(port):
                raise DemoError(f"127.0.0.1:{port}, needed for {what}, is in use "
                                "(is another `make demo` running?)")

    def start_directory(self) -> dict[str, str]:
        """Start the seeded OpenLDAP; return the GPUHUB_DIRECTORY_* settings for it."""
        ldap_dir = self.dir / "openldap"
        log = open(self.dir / "openldap.log", "ab")  # noqa: SIM115 (the directory writes to it until the demo ends)
        # Own session: Ctrl-C reaches only this script, which stops the
        # directory after the hub (whose logins need it until the end).
        self.ldap = subprocess.Popen(
            [PY, "-m", "devservices.ldap.openldap", "--dir", str(ldap_dir),
             "--port", str(self.args.ldap_port), "--ldaps-port", str(self.args.ldaps_port)],
            cwd=REPO, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + 180  # the first run installs slapd
        while not port_in_use(self.args.ldaps_port):
            if self.ldap.poll() is not None:
                raise DemoError(f"the demo directory exited ({self.ldap.returncode}); "
                                f"see {self.dir / 'openldap.log'}")
            if time.monotonic() > deadline:
                raise DemoError(f"the demo directory did not listen in time; see {self.dir / 'openldap.log'}")
            time.sleep(0.2)
        password_file = self.dir / "directory-bind-password"
        password_file.unlink(missing_ok=True)
        persistent_secret(password_file, lambda: seed.SERVICE_ACCOUNT.password)
        return {
            "GPUHUB_DIRECTORY": "openldap",
            "GPUHUB_DIRECTORY_SERVER": "127.0.0.1",
            "GPUHUB_DIRECTORY_PORT": str(self.args.ldap_port),
            "GPUHUB_DIRECTORY_TLS": "starttls",
            "GPUHUB_DIRECTORY_CA_FILE": str(ldap_dir / "tls" / "ca.pem"),
            "GPUHUB_DIRECTORY_BIND_DN": ldap_harness.SERVICE_DN,
            "GPUHUB_DIRECTORY_BIND_PASSWORD_FILE": str(password_file),
            "GPUHUB_DIRECTORY_USER_BASE": ldap_harness.USER_BASE,
            "GPUHUB_DIRECTORY_GROUP_BASE": ldap_harness.GROUP_BASE,
            "GPUHUB_DIRECTORY_ALLOWED_GROUPS": seed.ALLOWED_GROUP,
            "GPUHUB_DIRECTORY_ADMIN_GROUPS": seed.ADMIN_GROUP,
            "GPUHUB_DIRECTORY_EXEC_GROUPS": seed.EXEC_GROUP,
        }

    def hub_env(self, directory_env: dict[str, str], gpus: int, cpu_image: str,
                gpu_image: str) -> dict[str, str]:
        self.hub_dir.mkdir(parents=True, exist_ok=True)
        crypt_key = persistent_secret(self.dir / "crypt_key", lambda: secrets.token_hex(32))
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("GPUHUB_") and k != "JUPYTERHUB_CRYPT_KEY"}
        env.update(directory_env)
        env.update({
            "GPUHUB_BIND_URL": self.url,
            "GPUHUB_PROXY_API_PORT": str(self.args.port + 1),
            "GPUHUB_POOL_PAGE_PORT": str(self.args.port + 2),
            "GPUHUB_SSH": "true",
            "GPUHUB_SSH_ADDRESS": "127.0.0.1",
            "GPUHUB_SSH_PORT": str(self.args.ssh_port),
            "GPUHUB_SSH_PAGE_PORT": str(self.args.port + 3),
            "GPUHUB_JOBS": "true",
            "GPUHUB_GPU_HOUR_BUDGET": DEMO_BUDGET_GPU_HOURS,
            "GPUHUB_DATA_DIR": str(self.hub_dir),
            "GPUHUB_CONTAINER_PREFIX": "gpuhub-demo",
            "GPUHUB_HOME_VOLUME": "gpuhub-demo-home-{username}",
            "GPUHUB_INVENTORY": "nvml" if gpus else "simulated",
            "GPUHUB_SIMULATED_GPUS": str(SIMULATED_GPUS),
            "GPUHUB_CPU_IMAGE": cpu_image,
            "GPUHUB_GPU_IMAGE": gpu_image,
            "GPUHUB_MAX_GPUS_PER_USER": str(DEMO_SHARE_GPUS),
            "GPUHUB_PROFILES_FILE": str(self.write_profiles(cpu_image, gpu_image)),
            "GPUHUB_AUTHENTICATOR": "ldap",
            "JUPYTERHUB_CRYPT_KEY": crypt_key,
            "PYTHONUNBUFFERED": "1",
        })
        # Your own GPUHUB_* settings win over the demo's (the test switches GPUHUB_TEST_* aside).
        own = own_settings()
        for name in sorted(own):
            say(f"your setting: {name}={own[name]}")
        env.update(own)
        self.settings = env
        # The venv's bin (jupyterhub, the culler) first on PATH.
        env["PATH"] = f"{Path(PY).parent}{os.pathsep}{env.get('PATH', '')}"
        return env

    def write_profiles(self, cpu_image: str, gpu_image: str) -> Path:
        """The production profiles (GPUHUB_CPU_IMAGE / GPUHUB_GPU_IMAGE's) and the demo's one that
        may borrow, as a GPUHUB_PROFILES_FILE."""
        from types import SimpleNamespace

        from spawner.settings.hub import default_profiles

        images = SimpleNamespace(cpu_image=cpu_image, gpu_image=gpu_image)
        profiles = [*default_profiles(images), {**DEMO_BORROW_PROFILE, "image": gpu_image}]
        path = self.dir / "profiles.json"
        path.write_text(json.dumps(profiles, indent=1) + "\n")
        return path

    def write_config(self) -> Path:
        """The hub's config: the production one, then the demo's pool limits, then --config."""
        lines = ["# Written by devservices/demo.py at each start: the production config, then the demo's limits.",
                 "c = get_config()  # noqa: F821",
                 f"load_subconfig({str(REPO / 'hub_config' / 'jupyterhub_config.py')!r})  # noqa: F821"]
        lines += [f"c.GPUPool.{name} = {value!r}" for name, value in DEMO_POOL.items()]
        lines += self.mail_config()
        if self.args.config is not None:
            lines.append(f"load_subconfig({str(self.args.config.resolve())!r})  # noqa: F821 (--config)")
        path = self.dir / "jupyterhub_config.py"
        path.write_text("\n".join(lines) + "\n")
        return path

    def mail_config(self) -> list[str]:
        """The hub's mail settings: the demo's sink as its SMTP server, the directory's `mail`
        attribute as each user's address."""
        return ["c.EmailNotifications.enabled = True",
                'c.EmailNotifications.smtp_host = "127.0.0.1"',
                f"c.EmailNotifications.smtp_port = {self.args.smtp_port}",
                'c.EmailNotifications.security = "none"  # the sink on this machine: no login, no TLS',
                f"c.EmailNotifications.from_address = {DEMO_MAIL_FROM!r}",
                f"c.EmailNotifications.public_url = {self.url!r}",
                f"c.Notifications.ready_after = {DEMO_READY_AFTER!r}",
                'c.DirectoryAuthenticator.auth_state_attributes = ["mail"]']

    def start_mail_sink(self) -> None:
        from devservices.mail_sink import MailSink

        self.mail = MailSink(self.args.smtp_port, self.args.mail_port)
        self.mail.start()

    def start_hub(self, env: dict[str, str]) -> None:
        log_path = self.dir / "hub.log"
        log = open(log_path, "ab")  # noqa: SIM115 (the hub writes to it until the demo ends)
        self.hub = subprocess.Popen(
            [*self.launcher, PY, "-m", "jupyterhub", "-f", str(self.write_config())],
            cwd=self.hub_dir, env=env, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + 120
        while True:
            if self.hub.poll() is not None:
                raise DemoError(f"the hub exited ({self.hub.returncode}):\n{tail(log_path, 25)}")
            try:
                with urllib.request.urlopen(f"{self.url}/hub/api/", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise DemoError(f"the hub did not answer within 120 s:\n{tail(log_path, 25)}")
            time.sleep(0.5)

    def banner(self, gpus: int, cpu_image: str, gpu_image: str) -> None:
        groups = {name: sorted(seed.groups_of(name, "openldap")) for name in seed.users_for("openldap")}

        def role(name: str) -> str:
            if seed.ADMIN_GROUP in groups[name]:
                return "admin"
            return "user" if seed.ALLOWED_GROUP in groups[name] else f"refused (not in {seed.ALLOWED_GROUP})"

        rows = [(u.name, u.password, ", ".join(groups[u.name]) or "-", role(u.name))
                for u in seed.users_for("openldap").values()]
        widths = [max(len(r[i]) for r in rows + [("login", "password", "groups", "role")])
                  for i in range(4)]
        line = "  ".join(f"{{:<{w}}}" for w in widths)
        gpu_text = (f"{gpus} NVIDIA GPU(s) found by NVML" if gpus
                    else f"{SIMULATED_GPUS} simulated GPUs (no NVIDIA GPU found here)")
        print()
        print(f"  GPU JupyterHub demo is running: {self.url}")
        print(f"  GPUs: {gpu_text}")
        print(f"  images: CPU {cpu_image}, GPU {gpu_image}")
        print(f"  directory: OpenLDAP on 127.0.0.1:{self.args.ldap_port} (StartTLS) and "
              f":{self.args.ldaps_port} (LDAPS)")
        print()
        print("  Demo logins (throw-away test accounts of the demo directory):")
        for row in [("login", "password", "groups", "role"), *rows]:
            print(("    " + line.format(*row)).rstrip())
        print()
        for line in self.feature_lines():
            print(f"  {line}")
        print()
        print(f"  Logs: {self.dir / 'hub.log'}, {self.dir / 'openldap.log'}")
        print("  Ctrl-C stops the hub, its notebook servers, the mail sink and the directory.")
        print(flush=True)

    def feature_lines(self) -> list[str]:
        """Each feature, where to click (or what to type), as the banner prints them; a feature
        your own GPUHUB_* settings turned off is left out."""
        env, url = self.settings, self.url
        pool = f"{url}/services/gpu-pool/"
        alice = seed.users_for("openldap")["alice"]
        lines = [f"Start a server: {url}/hub/home (log in as alice; pick a profile, e.g. TensorFlow + 1 GPU; "
                 "JupyterLab's status bar then shows the GPU)"]
        if env.get("GPUHUB_POOL_PAGE", "true").lower() not in ("0", "false", "no", "off"):
            lines.append(f"Pool page: {pool} (GPUs, the queue, your GPU-hour budget: "
                         f"{env.get('GPUHUB_GPU_HOUR_BUDGET') or 'none'} GPU-hours per "
                         f"{DEMO_POOL['budget_period'] / 3600:g} h)")
            lines.append(f"Bookings: {pool}#bookings (at most {DEMO_POOL['booking_max_hours']:g} h, "
                         f"{DEMO_POOL['booking_max_days_ahead']:g} day ahead; GPUs in use are booked "
                         f"{DEMO_POOL['booking_notice']:g} s ahead, a no-show's go back after "
                         f"{DEMO_POOL['booking_grace']:g} s)")
            if env.get("GPUHUB_JOBS", "true").lower() not in ("0", "false", "no", "off"):
                lines.append(f"Jobs: {pool}#submit-job (submit a command; follow its log on the job's page)")
                lines.append("Notebook jobs: in JupyterLab open tensorflow-examples/starter.ipynb, press "
                             "'Create a job', pick tf-gpu-1, Create (or in a terminal: gpu-job submit "
                             "--profile tf-gpu-1 --notebook starter.ipynb); the executed copy lands beside it")
                lines.append('Schedules: gpu-job schedule create --cron "0 3 * * *" --profile tf-gpu-1 '
                             "--notebook starter.ipynb (fires while your server is stopped; gpu-job schedule list)")
                lines.append(f"Borrowing: your share is {DEMO_SHARE_GPUS} GPUs; past it, the profile "
                             f"'{DEMO_BORROW_PROFILE['display_name']}' (or gpu-job submit --borrow) runs on an "
                             "idle GPU, given back with notice (SIGTERM) when someone within theirs asks")
            lines.append(f"Action scripts: {pool}#exec-form (log in as carol: pool admin, in "
                         f"{seed.EXEC_GROUP}, which holds custom:gpu-pool:exec)")
        if env.get("GPUHUB_SSH", "").lower() in ("1", "true", "yes", "on"):
            port = env.get("GPUHUB_SSH_PORT", str(self.args.ssh_port))
            lines.append(f"SSH: ssh -p {port} {alice.name}@127.0.0.1 (password {alice.password}; "
                         f"once alice has logged in at {url}/hub/login; starts her server if none runs; "
                         f"keys: {url}/services/gpu-ssh/)")
        lines.append(f"Mail: http://127.0.0.1:{self.args.mail_port}/ lists what the hub mailed (SMTP sink on "
                     f"127.0.0.1:{self.args.smtp_port}): ready after {DEMO_READY_AFTER:g} s or more in the queue, "
                     "jobs that ran 5 min or more, cull warnings with their keep-it link")
        lines.append(f"Admin panel: {url}/hub/admin (log in as carol)")
        return lines

    # -------------------------------------------------------------- stop

    def stop(self) -> None:
        """Stop what this script started, by pid: the hub first, then the directory."""
        if self.hub is not None and self.hub.poll() is None:
            say("stopping the hub and its notebook servers")
            # SIGTERM: JupyterHub stops every server it runs (cleanup_servers),
            # its proxy and its services, then exits.
            self.hub.send_signal(signal.SIGTERM)
            try:
                self.hub.wait(120)
            except subprocess.TimeoutExpired:
                say("the hub did not stop in 120 s; killing it")
                self.hub.kill()
                self.hub.wait()
        if self.hub is not None:
            self._stop_leftovers_of_hub()
        if self.mail is not None:
            self.mail.stop()
            self.mail = None
        if self.ldap is not None and self.ldap.poll() is None:
            say("stopping the demo directory")
            self.ldap.send_signal(signal.SIGTERM)
            try:
                self.ldap.wait(30)
            except subprocess.TimeoutExpired:
                self.ldap.kill()
                self.ldap.wait()
        say("stopped")

    def _stop_leftovers_of_hub(self) -> None:
        # The hub stops its proxy and services at shutdown.  If it was killed,
        # they survive it (JupyterHub runs each in a session of its own): stop
        # the ones this demo saw as the hub's children, by pid.
        for pid, started in sorted(self.hub_children):
            if _start_time(pid) == started:
                say(f"stopping what the hub left running (pid {pid})")
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        (self.hub_dir / "jupyterhub-proxy.pid").unlink(missing_ok=True)

    def run(self) -> int:
        # Ctrl-C and TERM both end the wait below; stop() then runs once.
        def on_signal(signum, frame):
            self.stopping = True

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        try:
            self.preflight()
            self.dir.mkdir(parents=True, exist_ok=True)
            ensure_proxy()
            ensure_docker()
            gpus = nvml_gpu_count()
            cpu_image, gpu_image = build_images(gpus)
            if self.stopping:
                return 130
            say("starting the demo directory (OpenLDAP)")
            directory_env = self.start_directory()
            say("starting the mail sink")
            self.start_mail_sink()
            say("starting the hub")
            self.start_hub(self.hub_env(directory_env, gpus, cpu_image, gpu_image))
            self.hub_children |= children_of(self.hub.pid)
            self.banner(gpus, cpu_image, gpu_image)
            while not self.stopping:
                self.hub_children |= children_of(self.hub.pid)
                if self.hub.poll() is not None:
                    raise DemoError(f"the hub exited ({self.hub.returncode}):\n"
                                    f"{tail(self.dir / 'hub.log', 25)}")
                if self.ldap.poll() is not None:
                    raise DemoError(f"the demo directory exited ({self.ldap.returncode}); "
                                    f"see {self.dir / 'openldap.log'}")
                time.sleep(0.5)
            return 0
        except DemoError as exc:
            print(f"demo: {exc}", file=sys.stderr, flush=True)
            return 1
        finally:
            self.stop()


def own_settings() -> dict[str, str]:
    """The GPUHUB_* variables of the person running the demo (GPUHUB_TEST_* are the suite's)."""
    return {k: v for k, v in os.environ.items() if k.startswith("GPUHUB_") and not k.startswith("GPUHUB_TEST_")}


def _start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # field 22: start time in clock ticks


def children_of(parent: int) -> set[tuple[int, str]]:
    """(pid, start time) of the live processes whose parent is `parent` (Linux /proc)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent:
            found.add((int(entry.name), fields[19]))
    return found


def tail(path: Path, lines: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=REPO / ".demo",
                        help="where the demo keeps its data (default: .demo/)")
    parser.add_argument("--port", type=int, default=8000,
                        help="the hub's port on 127.0.0.1; the proxy API uses the next one")
    parser.add_argument("--ldap-port", type=int, default=3890)
    parser.add_argument("--ldaps-port", type=int, default=6360)
    add_feature_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    return Demo(build_parser().parse_args(argv)).run()


def add_feature_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ssh-port", type=int, default=2222,
                        help="the SSH gateway's port on 127.0.0.1 (default 2222); its key page uses the hub's port + 3")
    parser.add_argument("--smtp-port", type=int, default=2525,
                        help="the mail sink's SMTP port on 127.0.0.1 (default 2525): the hub's SMTP server")
    parser.add_argument("--mail-port", type=int, default=8025,
                        help="the mail sink's page on 127.0.0.1 (default 8025): the mails the hub sent")
    parser.add_argument("--config", type=Path, default=None,
                        help="a JupyterHub config file of yours, loaded after the demo's (c.GPUPool...)")


if __name__ == "__main__":
    sys.exit(main())
