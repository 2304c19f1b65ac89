"""Install the Debian packages a directory needs, without starting their daemons.

CI runs on a fresh Debian machine: the fixture installs what is missing.  The
packages' maintainer scripts would start a system-wide slapd (port 389) and
smbd/nmbd; those would collide with the directories the tests start, so a
policy-rc.d that refuses every service start is put in place for the length of
the install (the mechanism Debian provides for exactly this), then removed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

POLICY_RC_D = Path("/usr/sbin/policy-rc.d")


class InstallError(RuntimeError):
    """The packages could not be installed (not root, no apt, apt failed)."""


def ensure_packages(programs: dict[str, str]) -> None:
    """Make sure each program in `programs` (program -> Debian package) is installed."""
    missing = sorted({pkg for prog, pkg in programs.items() if not _which(prog)})
    if not missing:
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise InstallError(f"needs Debian packages {missing} (run as root with apt-get)")
    own_policy = not POLICY_RC_D.exists()
    if own_policy:
        POLICY_RC_D.write_text("#!/bin/sh\n# test harness: no daemons during install\nexit 101\n")
        POLICY_RC_D.chmod(0o755)
    try:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        proc = subprocess.run(
            ["apt-get", "install", "-y", "-qq", *missing],
            env=env, capture_output=True, text=True, timeout=900,
        )
        if proc.returncode != 0:
            # apt's own index may be stale on a fresh machine: update once, retry.
            subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=600)
            proc = subprocess.run(
                ["apt-get", "install", "-y", "-qq", *missing],
                env=env, capture_output=True, text=True, timeout=900,
            )
        if proc.returncode != 0:
            raise InstallError(f"apt-get install {missing} failed: {proc.stderr[-2000:]}")
    finally:
        if own_policy:
            POLICY_RC_D.unlink(missing_ok=True)
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
