"""A seeded Active Directory domain controller (Debian's Samba) on 127.0.0.1.

Used by the `samba_ad` pytest fixture and by hand:

    python -m devservices.ldap.samba_ad --dir .demo/samba-ad --config-out .demo/ad_config.py

Samba's LDAP server cannot move off ports 389 and 636, so those are used, on
127.0.0.1 only (`interfaces = 127.0.0.1`, `bind interfaces only = yes`).  Only
the `ldap` server service runs: no SMB, DNS, Kerberos or NetBIOS ports.

Provisioning and seeding (samba-tool, a few seconds each step) happen once per
set of inputs: the result is cached under the repository's .cache/samba-ad/,
keyed by a hash of the seed data, this module and Samba's version, and copied
to a fresh directory for every run.  The locked account is locked at start, by
failed binds, so the cached copy stays clean.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from ..apt import ensure_packages, which
from . import seed
from .common import (
    Directory,
    DirectoryServer,
    PortBusy,
    port_is_free,
    repo_root,
    serve_from_command_line,
    wait_for_port,
)

REALM = "GPUHUB.TEST"
DOMAIN = "GPUHUB"
HOST_NAME = "dc1"
BASE_DN = "DC=gpuhub,DC=test"
USER_BASE = f"CN=Users,{BASE_DN}"
# AD puts groups and users in the same container by default; searching the
# whole domain also finds groups admins moved into other OUs.
GROUP_BASE = BASE_DN
SERVICE_DN = f"CN={seed.SERVICE_ACCOUNT.name},{USER_BASE}"
TLS_SERVER_NAME = f"{HOST_NAME}.{REALM}".lower()
PORT, LDAPS_PORT = 389, 636
PACKAGES = {"samba": "samba", "samba-tool": "samba-common-bin", "openssl": "openssl"}


def user_dn(user: seed.SeedUser) -> str:
    # samba-tool names the entry after the full name: the DN does not contain
    # the login name, as in most real domains, so the hub must look it up.
    return f"CN={user.given_name} {user.surname},{USER_BASE}"


def _samba_version() -> str:
    return subprocess.run([which("samba"), "-V"], capture_output=True, text=True).stdout.strip()


def cache_key() -> str:
    h = hashlib.sha256()
    h.update(Path(__file__).read_bytes())
    h.update(json.dumps([asdict(u) for u in seed.USERS], sort_keys=True).encode())
    h.update(json.dumps([asdict(g) for g in seed.GROUPS], sort_keys=True).encode())
    h.update(json.dumps(asdict(seed.SERVICE_ACCOUNT)).encode())
    h.update(_samba_version().encode())
    return h.hexdigest()[:16]


def _tool(conf: Path, *args: str) -> None:
    proc = subprocess.run(
        [which("samba-tool"), *args, "-s", str(conf)], capture_output=True, text=True, timeout=300
    )
    if proc.returncode != 0:
        # args may hold a seed password: report the sub-command only.
        raise RuntimeError(f"samba-tool {' '.join(args[:2])} failed: {proc.stderr[-1500:]}")


def _set_globals(conf: Path, settings: dict[str, str]) -> None:
    """Replace or add `key = value` lines in smb.conf's [global] section."""
    lines = conf.read_text().splitlines()
    start = lines.index("[global]") + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("[")), len(lines))
    keep = [ln for ln in lines[start:end] if ln.split("=")[0].strip() not in settings]
    new = [f"\t{k} = {v}" for k, v in settings.items()]
    conf.write_text("\n".join(lines[:start] + keep + new + lines[end:]) + "\n")


def provision(target: Path) -> None:
    """Provision a domain into `target` and seed it from seed.py (offline)."""
    admin_pw = "Adm1n-" + hashlib.sha256(str(target).encode()).hexdigest()[:12]  # never used
    proc = subprocess.run(
        [
            which("samba-tool"), "domain", "provision", "--use-rfc2307", "--dns-backend=NONE",
            f"--targetdir={target}", f"--realm={REALM}", f"--domain={DOMAIN}",
            "--server-role=dc", f"--host-name={HOST_NAME}", f"--adminpass={admin_pw}",
            "--option=interfaces = 127.0.0.1", "--option=bind interfaces only = yes",
        ],
        capture_output=True, text=True, timeout=600,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"samba-tool domain provision failed: {proc.stderr[-2000:]}")
    conf = target / "etc" / "smb.conf"
    _set_globals(conf, {
        "server services": "ldap",
        "log file": str(target / "samba.log"),
        "log level": "1",
    })
    # Passwords never expire (the cache may outlive AD's 42-day default), and
    # AD_LOCKOUT_THRESHOLD failed binds lock an account.
    _tool(conf, "domain", "passwordsettings", "set", "--max-pwd-age=0",
          f"--account-lockout-threshold={seed.AD_LOCKOUT_THRESHOLD}")
    svc = seed.SERVICE_ACCOUNT
    _tool(conf, "user", "create", svc.name, svc.password)
    for user in seed.USERS:
        args = ["user", "create", user.name, user.password,
                f"--given-name={user.given_name}", f"--surname={user.surname}"]
        if user.uid_number is not None:
            args += [f"--uid-number={user.uid_number}", f"--gid-number={user.gid_number}",
                     f"--unix-home=/home/{user.name}", "--login-shell=/bin/bash"]
        _tool(conf, *args)
        if user.disabled:
            _tool(conf, "user", "disable", user.name)
    for group in seed.GROUPS:
        args = ["group", "add", group.name]
        if group.gid_number is not None:
            args += [f"--gid-number={group.gid_number}", f"--nis-domain={DOMAIN.lower()}"]
        if group.description:
            args.append(f"--description={group.description}")
        _tool(conf, *args)
    for group in seed.GROUPS:
        members = list(group.users) + list(group.groups)
        if members:
            _tool(conf, "group", "addmembers", group.name, ",".join(members))


def cached_provision() -> Path:
    """The provisioned, seeded domain for the current inputs (built on first use)."""
    cache_root = repo_root() / ".cache" / "samba-ad"
    final = cache_root / cache_key()
    if (final / "etc" / "smb.conf").exists():
        return final
    cache_root.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix="building-", dir=cache_root))
    try:
        provision(building)
        # Paths in smb.conf name the build directory; copies rewrite them.
        (building / "provisioned-at").write_text(str(building))
        try:
            building.rename(final)
        except OSError:  # another session finished first: use theirs
            shutil.rmtree(building, ignore_errors=True)
    except Exception:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return final


def copy_provision(source: Path, target: Path) -> Path:
    """Copy a cached domain to `target`, pointing its smb.conf at the copy."""
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source, target, symlinks=True)
    old = (source / "provisioned-at").read_text()
    conf = target / "etc" / "smb.conf"
    conf.write_text(conf.read_text().replace(old, str(target)))
    return conf


class SambaAD(DirectoryServer):
    """Start and stop one Samba AD DC from a cached provision, in `workdir`."""

    def __init__(self, workdir: Path):
        self.workdir = Path(workdir).resolve()
        self.proc: subprocess.Popen | None = None

    def start(self) -> Directory:
        ensure_packages(PACKAGES)
        for port in (PORT, LDAPS_PORT):
            if not port_is_free(port):
                raise PortBusy(f"127.0.0.1:{port} is already in use (another directory server?)")
        conf = copy_provision(cached_provision(), self.workdir / "domain")
        log_path = self.workdir / "samba.out"
        with open(log_path, "ab") as log:
            # -i: foreground, so the pid we hold is samba's; -M single: one process.
            self.proc = subprocess.Popen(
                [which("samba"), "-i", "-M", "single", "-s", str(conf)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )
        ca_file = self.workdir / "domain" / "private" / "tls" / "ca.pem"
        try:
            wait_for_port(LDAPS_PORT, self.proc, timeout=90)
            directory = self._directory(str(ca_file))
            self._wait_ready(directory, timeout=60)
            self._lock_accounts(directory)
        except Exception:
            self.stop()
            raise
        return directory

    def _directory(self, ca_file: str) -> Directory:
        return Directory(
            kind="active_directory",
            host="127.0.0.1",
            port=PORT,
            ldaps_port=LDAPS_PORT,
            ca_file=ca_file,
            base_dn=BASE_DN,
            user_base=USER_BASE,
            group_base=GROUP_BASE,
            bind_dn=SERVICE_DN,
            bind_password=seed.SERVICE_ACCOUNT.password,
            tls_server_name=TLS_SERVER_NAME,
            users=seed.users_for("active_directory"),
            groups={g.name: g for g in seed.GROUPS},
            pid=self.proc.pid,
            log_file=str(self.workdir / "samba.out"),
        )

    def _server(self, d: Directory):
        import ldap3
        from ldap3.core.tls import Tls

        tls = Tls(validate=ssl.CERT_REQUIRED, ca_certs_file=d.ca_file, valid_names=[d.tls_server_name])
        return ldap3.Server(d.host, port=d.ldaps_port, use_ssl=True, tls=tls,
                            connect_timeout=5, get_info=ldap3.NONE)

    def _wait_ready(self, d: Directory, timeout: float) -> None:
        # The port opens before the TLS certificate exists on first start; a
        # service-account bind over LDAPS is the real readiness check.
        import ldap3

        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"samba exited with {self.proc.returncode}; see {d.log_file}")
            try:
                conn = ldap3.Connection(self._server(d), d.bind_dn, d.bind_password, receive_timeout=5)
                if conn.bind():
                    conn.unbind()
                    return
                last = RuntimeError(conn.result.get("description"))
            except Exception as e:  # not up yet
                last = e
            time.sleep(0.5)
        raise TimeoutError(f"Samba AD not ready within {timeout:.0f} s: {last}")

    def _lock_accounts(self, d: Directory) -> None:
        import ldap3

        for user in d.users.values():
            if not user.locked:
                continue
            for _ in range(seed.AD_LOCKOUT_THRESHOLD):
                conn = ldap3.Connection(self._server(d), user_dn(user), "not-" + user.password,
                                        receive_timeout=5)
                conn.bind()
                conn.unbind()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=Path(".demo/samba-ad"))
    parser.add_argument("--config-out", type=Path, help="write hub settings for this directory here")
    args = parser.parse_args(argv)
    return serve_from_command_line(SambaAD(args.dir), args.config_out, "ldaps", "Samba AD")

if __name__ == "__main__":
    sys.exit(main())
