"""Installs never race: every apt-get goes through devservices/apt-install.sh, which waits.

On a fresh machine the base-image build used to run its own `apt-get install
debootstrap` while another test worker installed the directories' packages; it
met dpkg's lock, exited 100, and every test needing an image was skipped.  Here
another process holds dpkg's own lock while the real base-image build needs
debootstrap: the build waits for the lock and succeeds.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
INSTALLER = REPO / "devservices" / "apt-install.sh"
DPKG_FRONTEND_LOCK = "/var/lib/dpkg/lock-frontend"
HOLD_S = 5

# Holds dpkg's frontend lock the way apt and dpkg take it (a POSIX record lock),
# says so on stdout, and records the moment it lets go.
HOLDER = f"""
import fcntl, sys, time
f = open({DPKG_FRONTEND_LOCK!r}, "w")
fcntl.lockf(f, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(float(sys.argv[2]))
released = time.time()
fcntl.lockf(f, fcntl.LOCK_UN)
open(sys.argv[1], "w").write(repr(released))
"""


@pytest.fixture
def dpkg_lock_held(tmp_path):
    """Another process holds dpkg's lock for HOLD_S seconds; yields the file it writes on release."""
    released = tmp_path / "released"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(released), str(HOLD_S)], stdout=subprocess.PIPE,
                              text=True)
    assert holder.stdout.readline().strip() == "held"
    yield released
    holder.wait(timeout=HOLD_S + 30)


@pytest.fixture
def root_with_apt():
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.fail("these tests install Debian packages: run them as root on Debian", pytrace=False)


def test_plain_apt_get_fails_on_the_held_lock_the_installer_waits(root_with_apt, dpkg_lock_held):
    # What build-base.sh did before: apt-get without a lock timeout gives up at once.
    plain = subprocess.run(["apt-get", "install", "-y", "-qq", "openssl"], capture_output=True, text=True,
                           env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"}, timeout=60)
    assert plain.returncode == 100 and "lock" in plain.stderr.lower()
    waited = subprocess.run(["bash", str(INSTALLER), "openssl"], capture_output=True, text=True, timeout=600)
    assert waited.returncode == 0, waited.stderr
    assert dpkg_lock_held.exists(), "the installer finished before the lock was let go"
    assert float(dpkg_lock_held.read_text()) <= time.time()


def test_base_image_build_waits_for_dpkg_and_succeeds(root_with_apt, docker_client, tmp_path):
    # The base-image fixture's own lock: no other worker builds a base image meanwhile
    # (a build that finds its image cached needs no debootstrap at all).
    lock_path = REPO / ".cache" / "locks" / "base-image.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    repo = f"gpuhub/test-apt-wait-{os.getpid()}"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        # As on a fresh machine: no debootstrap, so the build must install it.
        removed = subprocess.run(["bash", "-c", "exec 9>/var/lib/apt/gpuhub-harness.lock; flock 9; "
                                  "dpkg -r debootstrap >/dev/null"], capture_output=True, text=True, timeout=300)
        assert removed.returncode == 0, removed.stderr
        assert not shutil.which("debootstrap", path="/usr/sbin:/usr/bin:/sbin:/bin")
        released = tmp_path / "released"
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(released), str(HOLD_S)],
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout.readline().strip() == "held"
            build = subprocess.run(["bash", str(REPO / "images" / "build-base.sh")], cwd=REPO, capture_output=True,
                                   text=True, timeout=900,
                                   env={**os.environ, "BASE_REPO": repo, "BASE_PACKAGES": "ca-certificates"})
        finally:
            holder.wait(timeout=HOLD_S + 30)
        assert build.returncode == 0, build.stderr[-3000:]
        assert "installing debootstrap" in build.stderr
        image = build.stdout.strip().splitlines()[-1]
        assert image.startswith(repo + ":")
        try:
            assert docker_client.images.get(image)
        finally:
            for tag in (image, f"{repo}:latest"):
                subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)
