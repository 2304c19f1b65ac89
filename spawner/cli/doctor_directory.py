"""`gpu-pool doctor`'s directory check: connect to the directory as the hub's login would.

Step by step, stopping at the first that fails: the TCP connection, the TLS handshake
(LDAPS, or StartTLS) verified with the configured CA, the service account's bind, a read
of the user and group bases, and each allowed and admin group found.  Messages name the
GPUHUB_DIRECTORY_* setting to fix; the bind password is never part of one.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import ldap3
from ldap3.core.exceptions import LDAPException
from ldap3.utils.conv import escape_filter_chars
from ldapauthenticator.ldapauthenticator import TlsStrategy

CHECK = "directory"


@dataclass
class Step:
    """A failed step: what happened and the fix."""

    detail: str
    fix: str


def _where(endpoint) -> str:
    if endpoint.tls_strategy == TlsStrategy.on_connect:
        return f"ldaps://{endpoint.address}:{endpoint.port}"
    tls = " (StartTLS)" if endpoint.tls_strategy == TlsStrategy.before_bind else " (plain LDAP)"
    return f"ldap://{endpoint.address}:{endpoint.port}{tls}"


def _tls_failure(endpoint, text: str, S: dict) -> Step:
    where = _where(endpoint)
    starttls = " -starttls ldap" if endpoint.tls_strategy == TlsStrategy.before_bind else ""
    show = f"`openssl s_client -connect {endpoint.address}:{endpoint.port}{starttls} -showcerts` shows its chain"
    if "hostname" in text.lower() or "doesn't match" in text.lower():
        return Step(f"TLS handshake with {where}: the certificate does not name {endpoint.address}: {text}",
                    f"set {S['tls_kwargs']} to the name in the directory's certificate ({show})")
    ca = endpoint.ca_file or "the system's CAs"
    return Step(f"TLS handshake with {where} failed: the certificate is not trusted by {ca}: {text}",
                f"set {S['tls_ca_file']} to the CA that signed the directory's certificate ({show})")


def _open(conn, endpoint, S: dict) -> Step | None:
    """Connect and, for StartTLS, start TLS; None when both worked."""
    where = _where(endpoint)
    try:
        conn.open()
    except LDAPException as e:
        text = f"{type(e).__name__}: {e}"
        if "ssl" in text.lower() or "certif" in text.lower():
            return _tls_failure(endpoint, text, S)
        return Step(f"cannot connect to {where}: {text}",
                    f"check {S['server_address']} and {S['server_port']}, and that this host may reach "
                    "the directory (a firewall, the directory's own access rules)")
    if endpoint.tls_strategy == TlsStrategy.before_bind:
        try:
            started = conn.start_tls()
        except LDAPException as e:
            return _tls_failure(endpoint, f"{type(e).__name__}: {e}", S)
        if not started:
            return Step(f"{where}: the directory refused StartTLS ({conn.result.get('description')})",
                        f"set {S['tls_strategy']}=ldaps (port 636), or enable StartTLS on the directory")
    return None


def _base_exists(conn, base: str) -> bool:
    conn.search(base, "(objectClass=*)", search_scope=ldap3.BASE, attributes=[])
    return conn.result.get("result") == 0 and any(r.get("type") == "searchResEntry" for r in conn.response or [])


def _find_group(conn, a, group: str) -> bool:
    if "=" in group:  # a DN
        return _base_exists(conn, group)
    base = a.group_search_base or a.user_search_base
    conn.search(base, f"({a.group_name_attribute}={escape_filter_chars(group)})", search_scope=ldap3.SUBTREE,
                attributes=[], size_limit=1)
    return any(r.get("type") == "searchResEntry" for r in conn.response or [])


def _steps(a, endpoint, S: dict) -> tuple[Step | None, str]:
    """Run the steps on one connection; (the failed step or None, what succeeded)."""
    conn = ldap3.Connection(
        endpoint.server(), user=a.lookup_dn_search_user or None, password=a.lookup_dn_search_password or None,
        receive_timeout=endpoint.read_timeout, auto_bind=ldap3.AUTO_BIND_NONE, auto_referrals=False,
        read_only=True, raise_exceptions=False)
    try:
        failed = _open(conn, endpoint, S)
        if failed:
            return failed, ""
        done = [_where(endpoint) + (f", TLS verified with {endpoint.ca_file}" if endpoint.ca_file else
                                    ", TLS verified with the system's CAs" if
                                    endpoint.tls_strategy != TlsStrategy.insecure else "")]
        if not conn.bind():
            who = a.lookup_dn_search_user or "anonymous"
            result = conn.result or {}
            return Step(f"{_where(endpoint)}: the bind as {who} was refused: {result.get('description')} "
                        f"{result.get('message') or ''}".strip(),
                        f"check {S['lookup_dn_search_user']} and the service account's password in "
                        f"{S['lookup_dn_search_password']} (one line, the hub's user may read it)"), ""
        done.append(f"bound as {a.lookup_dn_search_user}" if a.lookup_dn_search_user else "bound anonymously")
        for trait, base in (("user_search_base", a.user_search_base),
                            ("group_search_base", a.group_search_base or a.user_search_base)):
            if not _base_exists(conn, base):
                return Step(f"{S[trait]}={base!r}: no such entry, or the service account may not read it "
                            f"({conn.result.get('description')})",
                            f"set {S[trait]} to an existing DN the service account can read"), ""
        done.append("user and group bases read")
        found = []
        for trait in ("allowed_groups", "admin_groups"):
            for group in getattr(a, trait):
                if not _find_group(conn, a, group):
                    base = a.group_search_base or a.user_search_base
                    return Step(f"group {group!r} of {S[trait]} not found under {base} (by its "
                                f"{a.group_name_attribute}, or as a DN)",
                                f"correct {S[trait]} (group names or DNs), or {S['group_search_base']}"), ""
                found.append(group)
        if found:
            done.append(f"groups found: {', '.join(found)}")
        return None, "; ".join(done)
    except LDAPException as e:
        return Step(f"{_where(endpoint)}: {type(e).__name__}: {e}",
                    "check the directory's log; the hub's logins would fail the same way"), ""
    finally:
        with contextlib.suppress(LDAPException, OSError):
            conn.unbind()


def directory_result(config) -> tuple[str, str, str] | None:
    """The directory check's ("ok" | "warn" | "fail", detail, fix), or None when the hub does
    not log in against a directory."""
    from ..auth import DirectoryAuthenticator
    from ..auth.connection import Endpoint
    from ..auth.messages import SETTING, DirectoryConfigError

    OK, WARN, FAIL = "ok", "warn", "fail"

    hub = config.JupyterHub
    if hub.get("authenticator_class", None) not in ("gpu-directory", DirectoryAuthenticator):
        return None
    if "server_address" not in config.DirectoryAuthenticator:
        return (WARN, "GPUHUB_DIRECTORY is not set, so the directory is configured in a config file "
                "(c.DirectoryAuthenticator): not checked", "run gpu-pool doctor --config with that file")
    try:
        a = DirectoryAuthenticator(config=config)
    except DirectoryConfigError as e:
        return FAIL, str(e), "fix the directory's settings (GPUHUB_DIRECTORY_*)"
    endpoint = Endpoint.of(a)
    failed, done = _steps(a, endpoint, SETTING)
    if failed:
        return FAIL, failed.detail, failed.fix
    return OK, done, ""
