"""A seeded OpenLDAP (Debian's slapd) on 127.0.0.1, with StartTLS and LDAPS.

Used by the `openldap` pytest fixture and by `make demo`:

    python -m devservices.ldap.openldap --dir .demo/openldap --config-out .demo/ldap_config.py

starts slapd in the foreground until interrupted and writes the hub settings
(c.DirectoryAuthenticator...) for it to --config-out.

slapd runs with its own cn=config directory built from slapd.ldif.in by
`slapadd -n0`, and the data from seed.py loaded by `slapadd -n1` before start:
no system slapd, no /etc/ldap/slapd.d, nothing outside the work directory.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from ..apt import ensure_packages, which
from . import seed
from .common import Directory, DirectoryServer, PortBusy, port_is_free, serve_from_command_line, wait_for_port
from .tls import make_server_cert

BASE_DN = "dc=gpuhub,dc=test"
USER_BASE = f"ou=people,{BASE_DN}"
GROUP_BASE = f"ou=groups,{BASE_DN}"
SERVICE_DN = f"cn={seed.SERVICE_ACCOUNT.name},ou=services,{BASE_DN}"
PACKAGES = {"slapd": "slapd", "slapadd": "slapd", "ldapsearch": "ldap-utils", "openssl": "openssl"}

# Where Debian's slapd keeps its schema LDIFs and loadable backends.
SCHEMA_DIRS = ("/etc/ldap/schema", "/etc/openldap/schema")
MODULE_DIRS = ("/usr/lib/ldap", "/usr/lib/openldap", "/usr/lib64/openldap")


def ssha(password: str) -> str:
    """{SSHA} hash as slapd stores it: the seed LDIF never holds a clear password."""
    salt = os.urandom(8)
    digest = hashlib.sha1(password.encode() + salt).digest()
    return "{SSHA}" + base64.b64encode(digest + salt).decode()


def user_dn(name: str) -> str:
    return f"uid={name},{USER_BASE}"


def group_dn(name: str) -> str:
    return f"cn={name},{GROUP_BASE}"


def seed_ldif() -> str:
    """The directory's content as LDIF, generated from seed.py."""
    out = [
        f"dn: {BASE_DN}\nobjectClass: dcObject\nobjectClass: organization\ndc: gpuhub\no: GPU hub tests\n",
        f"dn: {USER_BASE}\nobjectClass: organizationalUnit\nou: people\n",
        f"dn: {GROUP_BASE}\nobjectClass: organizationalUnit\nou: groups\n",
        f"dn: ou=services,{BASE_DN}\nobjectClass: organizationalUnit\nou: services\n",
    ]
    svc = seed.SERVICE_ACCOUNT
    out.append(
        f"dn: {SERVICE_DN}\nobjectClass: organizationalRole\nobjectClass: simpleSecurityObject\n"
        f"cn: {svc.name}\nuserPassword: {ssha(svc.password)}\n"
    )
    for user in seed.users_for("openldap").values():
        lines = [
            f"dn: {user_dn(user.name)}",
            "objectClass: inetOrgPerson",
            f"uid: {user.name}",
            f"cn: {user.given_name} {user.surname}",
            f"givenName: {user.given_name}",
            f"sn: {user.surname}",
            f"mail: {user.name}@gpuhub.test",
            f"userPassword: {ssha(user.password)}",
        ]
        if user.uid_number is not None:
            lines += [
                "objectClass: posixAccount",
                f"uidNumber: {user.uid_number}",
                f"gidNumber: {user.gid_number}",
                f"homeDirectory: /home/{user.name}",
                "loginShell: /bin/bash",
            ]
        out.append("\n".join(lines) + "\n")
    present = seed.users_for("openldap")
    # Member groups must exist before the groups that list them? No: slapadd does
    # not check member DNs.  Order is kept as in seed.py for readability.
    for group in seed.GROUPS:
        lines = [f"dn: {group_dn(group.name)}", f"cn: {group.name}"]
        if group.description:
            lines.append(f"description: {group.description}")
        if group.posix:
            lines += ["objectClass: posixGroup", f"gidNumber: {group.gid_number}"]
            lines += [f"memberUid: {u}" for u in group.users if u in present]
        else:
            lines.append("objectClass: groupOfNames")
            members = [user_dn(u) for u in group.users if u in present]
            members += [group_dn(g) for g in group.groups]
            lines += [f"member: {m}" for m in members]
        out.append("\n".join(lines) + "\n")
    return "\n".join(out)


def _first_dir(candidates: tuple[str, ...], must_hold: str) -> str:
    for cand in candidates:
        if Path(cand, must_hold).exists():
            return cand
    raise FileNotFoundError(f"no {must_hold} in any of {candidates}; is slapd installed?")


class OpenLDAP(DirectoryServer):
    """Build, start and stop one slapd in `workdir`."""

    def __init__(self, workdir: Path, port: int, ldaps_port: int, extra_ldif: str = ""):
        self.workdir = Path(workdir).resolve()
        self.port, self.ldaps_port = port, ldaps_port
        # Entries loaded after the seed (a test's own OUs and groups); {base_dn} is replaced.
        self.extra_ldif = extra_ldif
        self.proc: subprocess.Popen | None = None

    def build(self) -> Path:
        ensure_packages(PACKAGES)
        if self.workdir.exists():
            shutil.rmtree(self.workdir)
        (self.workdir / "data").mkdir(parents=True)
        confdir = self.workdir / "slapd.d"
        confdir.mkdir()
        self.cert = make_server_cert(self.workdir / "tls")
        template = (Path(__file__).parent / "slapd.ldif.in").read_text()
        config = template.format(
            workdir=self.workdir,
            ca_file=self.cert.ca_file,
            cert_file=self.cert.cert_file,
            key_file=self.cert.key_file,
            module_dir=_first_dir(MODULE_DIRS, "back_mdb.la"),
            schema_dir=_first_dir(SCHEMA_DIRS, "core.ldif"),
            base_dn=BASE_DN,
            root_pw_hash=ssha(os.urandom(16).hex()),  # nobody needs the root DN
        )
        (self.workdir / "slapd.ldif").write_text(config)
        extra = self.extra_ldif.replace("{base_dn}", BASE_DN).strip()
        (self.workdir / "seed.ldif").write_text(seed_ldif() + ("\n" + extra + "\n" if extra else ""))
        slapadd = which("slapadd")
        for db, ldif in (("0", "slapd.ldif"), ("1", "seed.ldif")):
            proc = subprocess.run(
                [slapadd, "-n", db, "-F", str(confdir), "-l", str(self.workdir / ldif)],
                capture_output=True, text=True, timeout=120,
            )
            if proc.returncode != 0:
                raise RuntimeError(f"slapadd -n{db} {ldif} failed: {proc.stderr[-2000:]}")
        return confdir

    def start(self) -> Directory:
        for port in (self.port, self.ldaps_port):
            if not port_is_free(port):
                raise PortBusy(f"127.0.0.1:{port} is already in use")
        confdir = self.build()
        log_path = self.workdir / "slapd.log"
        urls = f"ldap://127.0.0.1:{self.port}/ ldaps://127.0.0.1:{self.ldaps_port}/"
        with open(log_path, "ab") as log:
            # -d 0: stay in the foreground (so the pid is slapd's own) and log nothing.
            self.proc = subprocess.Popen(
                [which("slapd"), "-h", urls, "-F", str(confdir), "-d", "0"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )
        try:
            wait_for_port(self.port, self.proc, timeout=30)
            wait_for_port(self.ldaps_port, self.proc, timeout=30)
        except Exception:
            self.stop()
            raise
        return Directory(
            kind="openldap",
            host="127.0.0.1",
            port=self.port,
            ldaps_port=self.ldaps_port,
            ca_file=str(self.cert.ca_file),
            base_dn=BASE_DN,
            user_base=USER_BASE,
            group_base=GROUP_BASE,
            bind_dn=SERVICE_DN,
            bind_password=seed.SERVICE_ACCOUNT.password,
            users=seed.users_for("openldap"),
            groups={g.name: g for g in seed.GROUPS},
            pid=self.proc.pid,
            log_file=str(log_path),
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=Path(".demo/openldap"))
    parser.add_argument("--port", type=int, default=3890)
    parser.add_argument("--ldaps-port", type=int, default=6360)
    parser.add_argument("--config-out", type=Path, help="write hub settings for this directory here")
    args = parser.parse_args(argv)
    return serve_from_command_line(OpenLDAP(args.dir, args.port, args.ldaps_port), args.config_out,
                                   "starttls", "OpenLDAP")

if __name__ == "__main__":
    sys.exit(main())
