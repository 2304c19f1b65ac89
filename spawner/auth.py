"""Log in with Active Directory or OpenLDAP: groups, admin rights and the Unix identity.

`DirectoryAuthenticator` extends jupyterhub-ldapauthenticator's `LDAPAuthenticator`
and keeps its settings (server, TLS strategy and `tls_kwargs`, `lookup_dn` with a
service account, `bind_dn_template`, `search_filter`, `allowed_groups`).  It adds:

- `directory = "active_directory" | "openldap"`, which picks sensible defaults:
  AD users log in with their sAMAccountName or userPrincipalName and their groups,
  nested ones included, come from one LDAP_MATCHING_RULE_IN_CHAIN search; OpenLDAP
  users log in with `uid` and their groups come from groupOfNames `member`,
  groupOfUniqueNames `uniqueMember` and posixGroup `memberUid`, nesting followed
  by the hub;
- verified TLS by default (LDAPS or StartTLS, `tls_ca_file`); plain LDAP only with
  `allow_plaintext = True`;
- disabled, locked and expired AD accounts refused with a message that says so;
- `admin_groups`, group names or DNs for `allowed_groups`, and the user's directory
  groups synced into JupyterHub groups at every login (`manage_groups`);
- `auth_state` = {"dn", "uid_number", "gid_number", "groups", "group_dns",
  "directory"}; the spawner runs the container as uid_number:gid_number;
- connect and read timeouts, and every blocking ldap3 call on a thread pool, so a
  slow or dead directory refuses logins instead of freezing the hub.

A refused login returns None from `authenticate` (JupyterHub's contract); where a
specific message helps the person at the login form (account disabled, directory
unreachable, not in an allowed group, malformed name) the hub shows that message
instead of "Invalid username or password".  Wrong passwords and unknown names get
the generic message, so the form cannot be used to probe which accounts exist.
No log line holds a password.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import re
import ssl
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import ldap3
from ldap3.core.exceptions import LDAPException
from ldap3.core.tls import Tls
from ldap3.utils.conv import escape_filter_chars
from ldap3.utils.dn import escape_rdn
from ldapauthenticator import LDAPAuthenticator
from ldapauthenticator.ldapauthenticator import TlsStrategy
from tornado import web
from traitlets import Bool, CaselessStrEnum, Float, Int, List, Unicode, default

OPENLDAP = "openldap"
ACTIVE_DIRECTORY = "active_directory"

# AD's LDAP_MATCHING_RULE_IN_CHAIN: "member, transitively".
IN_CHAIN = "1.2.840.113556.1.4.1941"
# userAccountControl and msDS-User-Account-Control-Computed bits.
UF_ACCOUNTDISABLE = 0x2
UF_LOCKOUT = 0x10
UF_PASSWORD_EXPIRED = 0x800000
# The "data NNN" sub-code in AD's invalidCredentials bind result.
AD_BIND_CODES = {
    "533": "disabled",
    "775": "locked",
    "532": "password_expired",
    "773": "password_expired",  # must change password at next logon
    "701": "account_expired",
    "530": "restricted",  # not permitted to log on at this time
    "531": "restricted",  # not permitted to log on from this workstation
}

# What the person at the login form reads.
MSG_NO_NAME = "Enter your username."
MSG_BAD_NAME = (
    "That is not a valid username. Use your directory account name "
    "(letters, digits, '.', '_' or '-')."
)
MSG_LONG_NAME = "That username is too long: usernames have at most {limit} characters."
MSG_NO_PASSWORD = "Enter your password."
MSG_ACCOUNT = {
    "disabled": "Your directory account is disabled. Ask your IT administrator to enable it.",
    "locked": (
        "Your directory account is locked after too many failed logins. Wait until it "
        "unlocks, or ask your IT administrator to unlock it."
    ),
    "password_expired": (
        "Your directory password has expired or must be changed. Change it, then log in again."
    ),
    "account_expired": "Your directory account has expired. Ask your IT administrator.",
    "restricted": "Your directory account may not log in from here or at this time.",
}
MSG_UNAVAILABLE = (
    "The hub cannot reach the login directory right now. Try again in a few minutes; "
    "if it keeps failing, tell your administrator."
)
MSG_MISCONFIGURED = (
    "The hub cannot check logins because its directory settings need attention. "
    "Tell your administrator."
)
MSG_NOT_ALLOWED = (
    "Your account is valid, but it is not in a group that may use this hub. "
    "Ask your administrator for access."
)


class DirectoryConfigError(ValueError):
    """The authenticator's configuration cannot work; the message says which setting."""


@dataclass
class LoginRefused(Exception):
    """A login is refused.  `log` is for the hub's log, `message` for the login form.

    `message=None` leaves JupyterHub's generic "Invalid username or password".
    """

    log: str
    message: str | None = None
    status: int = 403


class DirectoryUnavailable(Exception):
    """The directory could not be reached or did not answer in time."""


# Carries a refusal from authenticate()/check_allowed() (run by JupyterHub in
# their own tasks) back to get_authenticated_user(), which turns it into the
# message on the login form.  A mutable holder, because a task works on a copy
# of the context: setting the variable there would not be seen here.
_refusal_holder: contextvars.ContextVar[dict | None] = contextvars.ContextVar(
    "directory_login_refusal", default=None
)


def _loggable(name: str) -> str:
    # Like JupyterHub: never the whole of a long input (it may be a pasted secret).
    return repr(name) if len(name) <= 32 else f"{name[:16]!r}...({len(name)} chars)"


def _first(attrs: dict, name: str) -> str | None:
    value = attrs.get(name)
    if isinstance(value, list):
        value = value[0] if value else None
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return None if value is None else str(value)


def _int_or_none(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _close(conn) -> None:
    """Unbind, ignoring a connection that is already broken."""
    if conn is None:
        return
    try:
        conn.unbind()
    except (LDAPException, OSError):
        pass


def _norm_dn(dn: str) -> str:
    # Enough for comparing DNs a directory returned with DNs an admin typed.
    return ",".join(part.strip() for part in dn.split(",")).lower()


class DirectoryAuthenticator(LDAPAuthenticator):
    """Log in against Active Directory or OpenLDAP; sync groups; keep uid/gid."""

    directory = CaselessStrEnum(
        [OPENLDAP, ACTIVE_DIRECTORY],
        default_value=OPENLDAP,
        config=True,
        help="""
        The kind of directory: "openldap" or "active_directory".

        It sets the defaults of `user_attribute`, `lookup_dn_search_filter`,
        `lookup_dn_user_dn_attribute`, `group_search_filter`,
        `group_nesting_depth` and `valid_username_regex`, and turns on the
        Active Directory account checks (disabled, locked, expired).

        - "active_directory": users log in with sAMAccountName or
          userPrincipalName (alice or alice@example.com); groups are every
          group the user is a member of, nested ones included, found with one
          LDAP_MATCHING_RULE_IN_CHAIN search.
        - "openldap": users log in with `uid`; groups are groupOfNames
          (`member`), groupOfUniqueNames (`uniqueMember`) and posixGroup
          (`memberUid`) entries, nested groupOfNames followed by the hub.
        """,
    )

    allow_plaintext = Bool(
        False,
        config=True,
        help="""
        Allow `tls_strategy = "insecure"`: plain LDAP, passwords sent unencrypted.

        Off by default, and the hub refuses to start with plain LDAP unless this
        is True.  Only for a directory on the same host or a test setup.
        """,
    )

    tls_ca_file = Unicode(
        "",
        config=True,
        help="""
        PEM file with the CA certificate(s) that signed the directory's TLS certificate.

        Empty (default): the system's trusted CAs.  The directory's certificate is
        always verified (and its name checked against `server_address`, or
        against `tls_kwargs = {"valid_names": [...]}` when the certificate names
        the server differently); set `tls_kwargs = {"validate": ssl.CERT_NONE}`
        only if you really mean to trust any certificate.  For Samba AD the CA is
        `private/tls/ca.pem` in its private directory.
        """,
    )

    connect_timeout = Float(
        5.0,
        config=True,
        help="""
        Seconds to wait for the TCP connection to the directory.  A directory that
        is down fails the login after at most this long, with a message saying so.
        """,
    )

    read_timeout = Int(
        10,
        config=True,
        help="""
        Whole seconds to wait for each answer from the directory (TLS handshake,
        bind, search).  A login against a directory that accepts connections but hangs
        fails after a few multiples of this, instead of waiting forever.
        """,
    )

    executor_threads = Int(
        8,
        config=True,
        help="""
        Threads for directory calls.  ldap3 is blocking; logins run on this many
        threads so the hub keeps serving while a login waits on the directory.
        """,
    )

    max_username_length = Int(
        64,
        config=True,
        help="""
        Longest username accepted at the login form, in characters.  Longer input
        is refused before anything is sent to the directory.
        """,
    )

    group_search_base = Unicode(
        "",
        config=True,
        help="""
        Where groups are searched (subtree).  Empty: `user_search_base`.

        OpenLDAP: usually ou=groups,dc=example,dc=com.  Active Directory: the
        domain root (DC=example,DC=com) finds groups in every OU.
        """,
    )

    group_name_attribute = Unicode(
        "cn",
        config=True,
        help="""
        Attribute of a group entry that becomes the JupyterHub group name.
        """,
    )

    group_nesting_filter = Unicode(
        "(|(member={groupdn})(uniqueMember={groupdn}))",
        config=True,
        help="""
        Filter for groups that have the group `{groupdn}` as a member; used to
        follow nested groups when `group_nesting_depth` > 0.
        """,
    )

    group_nesting_depth = Int(
        config=True,
        help="""
        How many levels of nested groups the hub follows after the user's direct
        groups.  Default: 0 for Active Directory (its IN_CHAIN search already
        returns every level), 8 for OpenLDAP.
        """,
    )

    allowed_groups = List(
        Unicode(),
        config=True,
        help="""
        Groups whose members may log in: group names (the `group_name_attribute`,
        e.g. "gpu-users") or full DNs, compared case-insensitively.  Nested
        membership counts.  Empty (default): no group check; then set
        `allowed_users` or `allow_all`, as JupyterHub otherwise lets nobody in.
        """,
    )

    admin_groups = List(
        Unicode(),
        config=True,
        help="""
        Groups whose members are JupyterHub admins: names or DNs, like
        `allowed_groups`.  When set, the directory decides at every login: a
        user who left these groups loses admin rights (unless listed in
        `admin_users`).  Empty (default): admin rights are not touched.
        """,
    )

    uid_number_attribute = Unicode(
        "uidNumber",
        config=True,
        help="Attribute holding the user's numeric uid; auth_state['uid_number'].",
    )

    gid_number_attribute = Unicode(
        "gidNumber",
        config=True,
        help="Attribute holding the user's primary numeric gid; auth_state['gid_number'].",
    )

    @default("manage_groups")
    def _default_manage_groups(self) -> bool:
        # The point of a directory login here: GPU quotas and profiles use groups.
        return True

    @default("enable_auth_state")
    def _default_enable_auth_state(self) -> bool:
        # The spawner needs uid_number/gid_number.  JupyterHub refuses to start
        # without JUPYTERHUB_CRYPT_KEY in the environment when this is on.
        return True

    @default("lookup_dn")
    def _default_lookup_dn(self) -> bool:
        return True

    @default("use_lookup_dn_username")
    def _default_use_lookup_dn_username(self) -> bool:
        # The hub user is the directory's account name: "Alice" and
        # "alice@example.com" both become "alice".
        return True

    @default("user_attribute")
    def _default_user_attribute(self) -> str:
        return "sAMAccountName" if self.directory == ACTIVE_DIRECTORY else "uid"

    @default("lookup_dn_user_dn_attribute")
    def _default_lookup_dn_user_dn_attribute(self) -> str:
        return self.user_attribute

    @default("lookup_dn_search_filter")
    def _default_lookup_dn_search_filter(self) -> str:
        if self.directory == ACTIVE_DIRECTORY:
            return (
                "(&(objectCategory=person)(objectClass=user)"
                "(|(sAMAccountName={login})(userPrincipalName={login})))"
            )
        return "({login_attr}={login})"

    @default("group_search_filter")
    def _default_group_search_filter(self) -> str:
        if self.directory == ACTIVE_DIRECTORY:
            return f"(&(objectClass=group)(member:{IN_CHAIN}:={{userdn}}))"
        return "(|(member={userdn})(uniqueMember={userdn})(memberUid={uid}))"

    @default("group_nesting_depth")
    def _default_group_nesting_depth(self) -> int:
        return 0 if self.directory == ACTIVE_DIRECTORY else 8

    @default("valid_username_regex")
    def _default_valid_username_regex(self) -> str:
        name = r"[A-Za-z0-9][A-Za-z0-9._-]*"
        if self.directory == ACTIVE_DIRECTORY:
            return rf"{name}(@[A-Za-z0-9][A-Za-z0-9.-]*)?"  # sAMAccountName or UPN
        return name

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._executor: ThreadPoolExecutor | None = None
        self._validate_config()

    # ------------------------------------------------------------------ config

    def _validate_config(self) -> None:
        """Refuse configurations that cannot work, naming the setting to fix."""
        cls = type(self).__name__
        if not self.server_address:
            raise DirectoryConfigError(
                f"{cls}.server_address is empty: set it to the directory's host name."
            )
        if self.tls_strategy == TlsStrategy.insecure:
            if not self.allow_plaintext:
                raise DirectoryConfigError(
                    f'{cls}.tls_strategy = "insecure" sends passwords unencrypted. Use '
                    '"before_bind" (StartTLS) or "on_connect" (LDAPS) with tls_ca_file, or '
                    f"set {cls}.allow_plaintext = True if plain LDAP is really intended."
                )
            self.log.warning(
                "%s: plain LDAP to %s:%s; passwords cross the network unencrypted.",
                cls, self.server_address, self.server_port,
            )
        if self.tls_ca_file and not os.access(self.tls_ca_file, os.R_OK):
            raise DirectoryConfigError(
                f"{cls}.tls_ca_file = {self.tls_ca_file!r} is not a readable file."
            )
        if not self.lookup_dn and not self.bind_dn_template:
            raise DirectoryConfigError(
                f"{cls} needs lookup_dn = True (with user_search_base) or bind_dn_template."
            )
        if self.directory == ACTIVE_DIRECTORY and not self.lookup_dn:
            raise DirectoryConfigError(
                f'{cls}.directory = "active_directory" needs lookup_dn = True: AD users are '
                "found by sAMAccountName or userPrincipalName."
            )
        if self.lookup_dn and not self.user_search_base:
            raise DirectoryConfigError(
                f"{cls}.lookup_dn needs user_search_base (e.g. ou=people,dc=example,dc=com)."
            )
        if self.lookup_dn_search_user and self.lookup_dn_search_password is None:
            raise DirectoryConfigError(
                f"{cls}.lookup_dn_search_user is set but lookup_dn_search_password is not."
            )
        for name in ("connect_timeout", "read_timeout"):
            if not getattr(self, name) > 0:
                raise DirectoryConfigError(f"{cls}.{name} must be a positive number of seconds.")
        if self.executor_threads < 1 or self.max_username_length < 1:
            raise DirectoryConfigError(
                f"{cls}.executor_threads and max_username_length must be at least 1."
            )
        if self.group_nesting_depth < 0:
            raise DirectoryConfigError(f"{cls}.group_nesting_depth must be 0 or more.")
        try:
            re.compile(self.valid_username_regex)
        except re.error as e:
            raise DirectoryConfigError(f"{cls}.valid_username_regex does not compile: {e}") from None
        needs_groups = self.manage_groups or self.allowed_groups or self.admin_groups
        if needs_groups and not (self.group_search_base or self.user_search_base):
            raise DirectoryConfigError(f"{cls}.group_search_base is needed to find groups.")

    # -------------------------------------------------------------- connection

    def _server(self) -> ldap3.Server:
        strategy = self.tls_strategy
        tls = None
        if strategy != TlsStrategy.insecure:
            kwargs = {"validate": ssl.CERT_REQUIRED}
            if self.tls_ca_file:
                kwargs["ca_certs_file"] = self.tls_ca_file
            kwargs.update(self.tls_kwargs)
            tls = Tls(**kwargs)
        return ldap3.Server(
            self.server_address,
            port=self.server_port,
            use_ssl=strategy == TlsStrategy.on_connect,
            tls=tls,
            connect_timeout=self.connect_timeout,
            get_info=ldap3.NONE,  # no schema download on every login
        )

    def _bind(self, user: str | None, password: str | None) -> tuple[ldap3.Connection, bool]:
        """Open a connection (TLS as configured) and bind; (connection, bound?).

        Raises DirectoryUnavailable when the directory cannot be reached, times
        out or fails the TLS handshake.  A refused bind is (conn, False) with the
        reason in conn.result.
        """
        conn = ldap3.Connection(
            self._server(),
            user=user,
            password=password,
            receive_timeout=self.read_timeout,
            auto_bind=ldap3.AUTO_BIND_NONE,
            auto_referrals=False,  # never follow a referral to another host
            read_only=True,
            raise_exceptions=False,
        )
        try:
            conn.open()
            if self.tls_strategy == TlsStrategy.before_bind and not conn.start_tls():
                raise DirectoryUnavailable(f"StartTLS refused: {conn.result.get('description')}")
            return conn, conn.bind()
        except LDAPException as e:
            _close(conn)
            text = f"{type(e).__name__}: {e}"
            if "certif" in text.lower():
                text += " (is tls_ca_file the CA that signed the directory's certificate?)"
            raise DirectoryUnavailable(text) from None
        except DirectoryUnavailable:
            _close(conn)
            raise

    def get_connection(self, userdn, password):
        """ldapauthenticator's API: a bound connection, or None if the bind failed.

        Same contract as the parent's, with this class's TLS verification and timeouts.
        """
        conn, bound = self._bind(userdn, password)
        if bound:
            return conn
        _close(conn)
        return None

    def _search(self, conn, base: str, flt: str, attributes: list[str], scope=ldap3.SUBTREE,
                size_limit: int = 0) -> list[tuple[str, dict]]:
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

    # ------------------------------------------------------------------ login

    def _check_input(self, login: str, password: str | None) -> None:
        if not login:
            raise LoginRefused("empty username", MSG_NO_NAME)
        if len(login) > self.max_username_length:
            raise LoginRefused(
                f"username of {len(login)} characters exceeds max_username_length",
                MSG_LONG_NAME.format(limit=self.max_username_length),
            )
        if not re.fullmatch(self.valid_username_regex, login):
            raise LoginRefused("username does not match valid_username_regex", MSG_BAD_NAME)
        # An empty password would make an LDAP "unauthenticated bind", which
        # many directories answer with success: never send one.
        if password is None or not password.strip():
            raise LoginRefused("blank password", MSG_NO_PASSWORD)

    def _lookup(self, conn, login: str) -> tuple[str, str]:
        """The user's (DN, account name) found by the lookup filter."""
        flt = self.lookup_dn_search_filter.format(
            login_attr=self.user_attribute, login=escape_filter_chars(login)
        )
        attr = self.lookup_dn_user_dn_attribute
        entries = self._search(conn, self.user_search_base, flt, [attr], size_limit=2)
        if not entries:
            raise LoginRefused("no such user in the directory")
        if len(entries) > 1:
            self.log.error("Lookup filter %s matches several entries; it must match one.", flt)
            raise LoginRefused("lookup matched several entries")
        dn, attrs = entries[0]
        name = _first(attrs, attr)
        if not name:
            self.log.error("Entry %s has no %s (lookup_dn_user_dn_attribute).", dn, attr)
            raise LoginRefused(f"entry has no {attr}")
        return dn, name

    def _entry_attributes(self, conn, dn: str) -> dict:
        attrs = [self.uid_number_attribute, self.gid_number_attribute, *self.auth_state_attributes]
        if self.directory == ACTIVE_DIRECTORY:
            # The computed attribute is only returned for a base-scope read.
            attrs += ["userAccountControl", "lockoutTime", "msDS-User-Account-Control-Computed"]
        entries = self._search(conn, dn, "(objectClass=*)", attrs, scope=ldap3.BASE)
        if not entries:
            self.log.warning("Could not read the entry %s: no uid/gid for this login.", dn)
            return {}
        return dict(entries[0][1])

    def _account_problem(self, attrs: dict) -> str | None:
        """Why AD will not let this account log in, from its attributes, or None."""
        if self.directory != ACTIVE_DIRECTORY:
            return None
        uac = _int_or_none(_first(attrs, "userAccountControl")) or 0
        if uac & UF_ACCOUNTDISABLE:
            return "disabled"
        computed = _int_or_none(_first(attrs, "msDS-User-Account-Control-Computed"))
        if computed is not None:
            if computed & UF_LOCKOUT:
                return "locked"
            if computed & UF_PASSWORD_EXPIRED:
                return "password_expired"
        elif (_int_or_none(_first(attrs, "lockoutTime")) or 0) > 0:
            return "locked"  # directories without the computed attribute
        return None

    def _bind_user(self, dn: str, password: str):
        """Bind as the user: the password check.  Returns the bound connection.

        AD tells why it refused a correct password ("data 533": disabled, ...);
        that is passed on.  Any other refusal gets the generic message, even when
        the entry's attributes say the account is disabled: the password was not
        proven, and the form must not tell strangers which accounts exist.
        """
        conn, bound = self._bind(dn, password)
        if bound:
            return conn
        result = conn.result or {}
        _close(conn)
        match = re.search(r"data ([0-9a-f]{3})", result.get("message") or "")
        problem = AD_BIND_CODES.get(match.group(1)) if match else None
        if problem:
            raise LoginRefused(f"account {problem} (directory: {result.get('message')})",
                               MSG_ACCOUNT[problem])
        raise LoginRefused(f"bind refused: {result.get('description')}")

    def _groups(self, conn, user_dn: str, uid: str) -> dict[str, str]:
        """{group DN: group name} of every group the user is in, nesting followed."""
        base = self.group_search_base or self.user_search_base
        name_attr = self.group_name_attribute
        flt = self.group_search_filter.format(
            userdn=escape_filter_chars(user_dn), uid=escape_filter_chars(uid)
        )
        found: dict[str, tuple[str, str]] = {}  # normalized DN -> (DN, name)

        def add(entries) -> list[str]:
            new = []
            for dn, attrs in entries:
                key = _norm_dn(dn)
                if key not in found:
                    rdn_value = dn.split(",", 1)[0].split("=", 1)[-1]
                    found[key] = (dn, _first(attrs, name_attr) or rdn_value)
                    new.append(dn)
            return new

        frontier = add(self._search(conn, base, flt, [name_attr]))
        for _ in range(self.group_nesting_depth):
            if not frontier:
                break
            parts = "".join(
                self.group_nesting_filter.format(groupdn=escape_filter_chars(g)) for g in frontier
            )
            frontier = add(self._search(conn, base, f"(|{parts})", [name_attr]))
        return dict(found.values())

    def _authenticate_blocking(self, login: str, password: str | None) -> dict:
        """The whole login against the directory; runs on the thread pool."""
        self._check_input(login, password)
        service = user_conn = None
        try:
            if self.lookup_dn:
                service, bound = self._bind(self.lookup_dn_search_user,
                                            self.lookup_dn_search_password)
                if not bound:
                    self.log.error(
                        "The lookup account %r could not bind: %s. Check "
                        "lookup_dn_search_user and lookup_dn_search_password.",
                        self.lookup_dn_search_user, service.result.get("description"),
                    )
                    raise LoginRefused("lookup bind failed", MSG_MISCONFIGURED, 503)
                dn, name = self._lookup(service, login)
                attrs = self._entry_attributes(service, dn)
                user_conn = self._bind_user(dn, password)
            else:
                name = login
                for template in self.bind_dn_template:
                    dn = template.format(username=escape_rdn(login))
                    conn, bound = self._bind(dn, password)
                    if bound:
                        user_conn = conn
                        break
                    _close(conn)
                if user_conn is None:
                    raise LoginRefused("no bind_dn_template bound with this password")
                attrs = self._entry_attributes(user_conn, dn)
            # The password is proven: now the account's state may be told.
            problem = self._account_problem(attrs)
            if problem:
                raise LoginRefused(f"account {problem} (userAccountControl)", MSG_ACCOUNT[problem])
            reader = service or user_conn
            if self.search_filter:
                flt = self.search_filter.format(
                    userattr=self.user_attribute, username=escape_filter_chars(name)
                )
                if len(self._search(reader, self.user_search_base, flt, [], size_limit=2)) != 1:
                    raise LoginRefused("search_filter does not match exactly this user")
            groups = self._groups(reader, dn, name)
        finally:
            _close(service)
            _close(user_conn)

        names = sorted(set(groups.values()))
        auth_state = {
            "dn": dn,
            "uid_number": _int_or_none(_first(attrs, self.uid_number_attribute)),
            "gid_number": _int_or_none(_first(attrs, self.gid_number_attribute)),
            "groups": names,
            "group_dns": sorted(groups),
            "directory": self.directory,
        }
        if self.auth_state_attributes:
            auth_state["user_attributes"] = {
                a: attrs.get(a) for a in self.auth_state_attributes if a in attrs
            }
        if not self.use_lookup_dn_username:
            name = login
        admin = None
        if self.admin_groups:
            admin = self._in_groups(self.admin_groups, auth_state) or (
                self.normalize_username(name) in self.admin_users
            )
        return {"name": name, "admin": admin, "groups": names, "auth_state": auth_state}

    @staticmethod
    def _in_groups(wanted: list[str], auth_state: dict) -> bool:
        names = {g.lower() for g in auth_state.get("groups", [])}
        dns = {_norm_dn(d) for d in auth_state.get("group_dns", [])}
        return any(_norm_dn(w) in dns if "=" in w else w.lower() in names for w in wanted)

    def _refuse(self, login: str, refusal: LoginRefused) -> None:
        self.log.warning("Login refused for %s: %s", _loggable(login), refusal.log)
        holder = _refusal_holder.get()
        if holder is not None:
            holder["refusal"] = refusal

    async def authenticate(self, handler, data):
        """Check the login against the directory; the auth model, or None if refused."""
        login = (data.get("username") or "").strip()
        password = data.get("password")
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.executor_threads, "directory-login")
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(
                self._executor, self._authenticate_blocking, login, password
            )
        except LoginRefused as refusal:
            self._refuse(login, refusal)
        except DirectoryUnavailable as e:
            self._refuse(login, LoginRefused(
                f"directory {self.server_address}:{self.server_port} unavailable: {e}",
                MSG_UNAVAILABLE, 503,
            ))
        except Exception:
            # A bug or an ldap3 surprise: the traceback goes to the log (it holds
            # no password: ldap3's messages do not carry credentials), the user
            # gets a message, not a stack trace.
            self.log.exception("Login of %s failed unexpectedly", _loggable(login))
            self._refuse(login, LoginRefused("unexpected error", MSG_UNAVAILABLE, 503))
        return None

    async def check_allowed(self, username, auth_model):
        """Allowed by `allowed_users`, or by membership in one of `allowed_groups`."""
        if username in self.allowed_users:
            return True
        auth_state = (auth_model or {}).get("auth_state") or {}
        if self.allowed_groups and self._in_groups(self.allowed_groups, auth_state):
            return True
        if auth_model is not None:
            self._refuse(username, LoginRefused("not in allowed_groups", MSG_NOT_ALLOWED))
        return False

    async def get_authenticated_user(self, handler, data):
        # JupyterHub renders an HTTPError raised here as the login form's error
        # message; a refusal without a message keeps the generic one.
        holder: dict = {}
        token = _refusal_holder.set(holder)
        try:
            user = await super().get_authenticated_user(handler, data)
        finally:
            _refusal_holder.reset(token)
        refusal = holder.get("refusal")
        if user is None and refusal is not None and refusal.message:
            raise web.HTTPError(refusal.status, refusal.message)
        return user
