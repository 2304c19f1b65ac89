"""The wire to the directory: server and verified TLS, connect/read timeouts, bind, search.

Every ldap3 call of a login goes through here, so a directory that is down, slow
or presents a bad certificate becomes one error, DirectoryUnavailable.
"""

from __future__ import annotations

import contextlib
import ssl
from dataclasses import dataclass, field
from typing import Any

import ldap3
from ldap3.core.exceptions import LDAPException
from ldap3.core.tls import Tls
from ldapauthenticator.ldapauthenticator import TlsStrategy

from .messages import SETTING, DirectoryUnavailable


@dataclass(frozen=True)
class Endpoint:
    """Where and how to connect: DirectoryAuthenticator's server, TLS and timeout settings."""

    address: str
    port: int | None
    tls_strategy: TlsStrategy
    ca_file: str = ""
    tls_kwargs: dict = field(default_factory=dict)
    connect_timeout: float = 5.0
    read_timeout: int = 10

    @classmethod
    def of(cls, settings) -> Endpoint:
        """The endpoint an authenticator's traits describe."""
        return cls(
            address=settings.server_address,
            port=settings.server_port,
            tls_strategy=settings.tls_strategy,
            ca_file=settings.tls_ca_file,
            tls_kwargs=settings.tls_kwargs,
            connect_timeout=settings.connect_timeout,
            read_timeout=settings.read_timeout,
        )

    def server(self) -> ldap3.Server:
        strategy = self.tls_strategy
        tls = None
        if strategy != TlsStrategy.insecure:
            kwargs: dict[str, Any] = {"validate": ssl.CERT_REQUIRED}
            if self.ca_file:
                kwargs["ca_certs_file"] = self.ca_file
            kwargs.update(self.tls_kwargs)
            tls = Tls(**kwargs)
        return ldap3.Server(
            self.address,
            port=self.port,
            use_ssl=strategy == TlsStrategy.on_connect,
            tls=tls,
            connect_timeout=self.connect_timeout,
            get_info=ldap3.NONE,  # no schema download on every login
        )


def close(conn) -> None:
    """Unbind, ignoring a connection that is already broken."""
    if conn is None:
        return
    with contextlib.suppress(LDAPException, OSError):
        conn.unbind()


def bind(endpoint: Endpoint, user: str | None,
         password: str | None) -> tuple[ldap3.Connection, bool]:
    """Open a connection (TLS as configured) and bind; (connection, bound?).

    Raises DirectoryUnavailable when the directory cannot be reached, times
    out or fails the TLS handshake.  A refused bind is (conn, False) with the
    reason in conn.result.
    """
    conn = ldap3.Connection(
        endpoint.server(),
        user=user,
        password=password,
        receive_timeout=endpoint.read_timeout,
        auto_bind=ldap3.AUTO_BIND_NONE,
        auto_referrals=False,  # never follow a referral to another host
        read_only=True,
        raise_exceptions=False,
    )
    try:
        conn.open()
        if endpoint.tls_strategy == TlsStrategy.before_bind and not conn.start_tls():
            raise DirectoryUnavailable(f"StartTLS refused: {conn.result.get('description')}")
        return conn, conn.bind()
    except LDAPException as e:
        close(conn)
        text = f"{type(e).__name__}: {e}"
        if "certif" in text.lower():
            text += f" (is {SETTING['tls_ca_file']} the CA that signed the directory's certificate?)"
        raise DirectoryUnavailable(text) from None
    except DirectoryUnavailable:
        close(conn)
        raise


def search(conn, base: str, flt: str, attributes: list[str], scope=ldap3.SUBTREE,
           size_limit: int = 0) -> list[tuple[str, dict]]:
    """[(DN, attributes)] of the entries found; DirectoryUnavailable if the search fails."""
    try:
        conn.search(base, flt, search_scope=scope, attributes=attributes, size_limit=size_limit)
    except LDAPException as e:
        raise DirectoryUnavailable(f"search failed: {type(e).__name__}: {e}") from None
    code = conn.result.get("result")
    # 0 success, 4 sizeLimitExceeded (entries still returned), 32 noSuchObject
    # (base search on an entry the reader may not see).
    if code not in (0, 4, 32):
        raise DirectoryUnavailable(
            f"search under {base!r} failed: {conn.result.get('description')} "
            f"{conn.result.get('message') or ''}".strip()
        )
    return [
        (r["dn"], r.get("attributes") or {})
        for r in (conn.response or [])
        if r.get("type") == "searchResEntry"
    ]
