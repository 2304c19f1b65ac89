"""Install the Debian packages a service needs, without starting their daemons.

CI runs on a fresh Debian machine: the fixtures install what is missing.
Packages' maintainer scripts would start system-wide daemons (slapd on 389,
smbd, a PostgreSQL cluster on 5432) that collide with the ones the tests
start, so a policy-rc.d that refuses every service start is put in place for
the length of the install (the mechanism Debian provides for exactly this),
then removed.  A fresh machine may have no package lists yet: on a failed
install, `apt-get update` runs once and the install is retried.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from pathlib import Path

POLICY_RC_D = Path("/usr/sbin/policy-rc.d")
# Installs take turns: test workers side by side would otherwise meet dpkg's lock.
LOCK_FILE = Path("/var/lib/apt/gpuhub-harness.lock")


class InstallError(RuntimeError):
    """The packages could not be installed (not root, no apt, apt failed)."""


def apt_install(packages: list[str], options: tuple[str, ...] = ()) -> None:
    """apt-get install `packages` (no daemons started); InstallError when it cannot."""
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise InstallError(f"needs Debian packages {packages} (run as root with apt-get)")
    with open(LOCK_FILE, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _install_locked(packages, options)


def _install_locked(packages: list[str], options: tuple[str, ...]) -> None:
    own_policy = not POLICY_RC_D.exists()
    if own_policy:
        POLICY_RC_D.write_text("#!/bin/sh\n# test harness: no daemons during install\nexit 101\n")
        POLICY_RC_D.chmod(0o755)
    try:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        command = ["apt-get", "install", "-y", "-qq", "-o", "DPkg::Lock::Timeout=600", *options, *packages]
        proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            # apt's own index may be missing or stale on a fresh machine: update once, retry.
            subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=600)
            proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise InstallError(f"apt-get install {packages} failed: {proc.stderr[-2000:]}")
    finally:
        if own_policy:
            POLICY_RC_D.unlink(missing_ok=True)


def ensure_packages(programs: dict[str, str]) -> None:
    """Make sure each program in `programs` (program -> Debian package) is installed."""
    missing = sorted({pkg for prog, pkg in programs.items() if not _which(prog)})
    if not missing:
        return
    apt_install(missing)
    still = [prog for prog in programs if not _which(prog)]
    if still:
        raise InstallError(f"installed {missing} but still missing {still}")


def _which(program: str) -> str | None:
    # slapd and samba live in /usr/sbin, which a non-login PATH may lack.
    return shutil.which(program) or shutil.which(program, path="/usr/sbin:/sbin")


def which(program: str) -> str:
    found = _which(program)
    if not found:
        raise InstallError(f"{program} not found")
    return found
