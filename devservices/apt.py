"""Install the Debian packages a service needs, through devservices/apt-install.sh.

CI runs on a fresh Debian machine: the fixtures and demos install what is
missing.  Every install in the project goes through that one script, which
takes the project's install lock, waits for dpkg's own lock, and keeps the
packages' daemons from starting (see the script).  `make test` installs the
suite's packages in one transaction before pytest starts; these calls then
find everything present and install nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

INSTALLER = Path(__file__).resolve().parent / "apt-install.sh"


class InstallError(RuntimeError):
    """The packages could not be installed (not root, no apt, apt failed)."""


def apt_install(packages: list[str], options: tuple[str, ...] = ()) -> None:
    """apt-get install `packages` (no daemons started); InstallError when it cannot."""
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise InstallError(f"needs Debian packages {packages} (run as root with apt-get)")
    proc = subprocess.run(["bash", str(INSTALLER), *options, *packages], capture_output=True, text=True,
                          timeout=1800)
    if proc.returncode != 0:
        raise InstallError(f"apt-get install {packages} failed: {proc.stderr[-2000:]}")


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
