"""DirectoryAuthenticator: the settings admins configure, and the part JupyterHub calls.

The async login on a thread pool, refusals relayed to the login form and the
allowed-groups check; the directory work of a login itself is in login.py.
"""

from __future__ import annotations

import asyncio
import contextvars
from concurrent.futures import ThreadPoolExecutor

from ldapauthenticator import LDAPAuthenticator
from tornado import web
from traitlets import Bool, CaselessStrEnum, Dict, Float, Int, List, Unicode, default

from . import connection
from .entries import in_groups
from .kinds import ACTIVE_DIRECTORY, KINDS, OPENLDAP
from .login import DirectoryLogin, group_carriers, privileged_groups
from .messages import (
    MSG_NOT_ALLOWED,
    MSG_UNAVAILABLE,
    SETTING,
    DirectoryConfigError,
    DirectoryUnavailable,
    LoginRefused,
    loggable,
)
from .standing import StandingCheck
from .validation import validate_config

# Carries a refusal from authenticate()/check_allowed() (run by JupyterHub in
# their own tasks) back to get_authenticated_user(), which turns it into the
# message on the login form.  A mutable holder, because a task works on a copy
# of the context: setting the variable there would not be seen here.
_refusal_holder: contextvars.ContextVar[dict | None] = contextvars.ContextVar(
    "directory_login_refusal", default=None
)


def _kind_default(trait: str):
    """A traitlets default for `trait`: the value kinds.KINDS gives the configured directory."""

    @default(trait)
    def _default(self):
        return getattr(KINDS[self.directory], trait)

    return _default


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

    role_groups = Dict(
        key_trait=Unicode(),
        value_trait=List(Unicode()),
        config=True,
        help="""
        Hub groups that carry privileged roles, filled by the directory at every login:
        {hub group: [directory groups]}.  A user is put in the hub group when they
        are in one of its directory groups (names or DNs, nesting followed), and
        taken out at their next login when they are no longer.

        Unlike the groups synced by `manage_groups` (named after each directory
        group's `group_name_attribute`, which is unique only within one OU), these
        are decided by DN: a name stands for the one directory group carrying it, a
        name several directory groups carry grants nothing (and the hub refuses to
        start with it), and a directory group named like one of these hub groups is
        not synced.  Give roles to these hub groups in `JupyterHub.load_roles`,
        never to a synced group's name.  The GPU pool page fills it from
        GPUHUB_DIRECTORY_ADMIN_GROUPS and GPUHUB_DIRECTORY_EXEC_GROUPS.  Empty
        (default): no such groups.
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

    @default("lookup_dn_user_dn_attribute")
    def _default_lookup_dn_user_dn_attribute(self) -> str:
        return self.user_attribute

    # The defaults that depend on the directory kind, from the table in kinds.py.
    _default_user_attribute = _kind_default("user_attribute")
    _default_lookup_dn_search_filter = _kind_default("lookup_dn_search_filter")
    _default_group_search_filter = _kind_default("group_search_filter")
    _default_group_nesting_depth = _kind_default("group_nesting_depth")
    _default_valid_username_regex = _kind_default("valid_username_regex")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._executor: ThreadPoolExecutor | None = None
        validate_config(self)

    def _server(self):
        """The ldap3 Server these settings describe (TLS verified unless plain LDAP)."""
        return connection.Endpoint.of(self).server()

    def get_connection(self, userdn, password):
        """ldapauthenticator's API: a bound connection, or None if the bind failed.

        Same contract as the parent's, with this class's TLS verification and timeouts.
        """
        conn, bound = connection.bind(connection.Endpoint.of(self), userdn, password)
        if bound:
            return conn
        connection.close(conn)
        return None

    def _authenticate_blocking(self, login: str, password: str | None) -> dict:
        """The whole login against the directory; runs on the thread pool."""
        return DirectoryLogin(self).run(login, password)

    def _refuse(self, login: str, refusal: LoginRefused) -> None:
        self.log.warning("Login refused for %s: %s", loggable(login), refusal.log)
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
            self.log.exception("Login of %s failed unexpectedly", loggable(login))
            self._refuse(login, LoginRefused("unexpected error", MSG_UNAVAILABLE, 503))
        return None

    async def check_standing(self, username: str) -> str | None:
        """For a login proven without the password (an SSH key, a hub API token): None when
        the account may log in now (found, not disabled or locked, in `allowed_groups`), else
        the message a refused login shows.  The same checks as a password login's, minus the bind."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.executor_threads, "directory-login")
        loop = asyncio.get_running_loop()
        try:
            model = await loop.run_in_executor(self._executor, StandingCheck(self).run, username)
        except LoginRefused as refusal:
            self.log.warning("Standing of %s refused: %s", loggable(username), refusal.log)
            return refusal.message or "Your account may not log in now"
        except DirectoryUnavailable as e:
            self.log.warning("Standing of %s not checked: directory unavailable: %s", loggable(username), e)
            return MSG_UNAVAILABLE
        if username in self.allowed_users or (self.allowed_groups and in_groups(self.allowed_groups,
                                                                                 model["auth_state"])):
            return None
        if not self.allowed_groups and not self.allowed_users:
            return None if self.allow_all else MSG_NOT_ALLOWED
        return MSG_NOT_ALLOWED

    def check_allow_config(self):
        """At the hub's start: refuse a privileged group given by a name several directory
        groups carry (anyone who may create a group could otherwise borrow its rights)."""
        super().check_allow_config()
        named = list(dict.fromkeys(g for g in privileged_groups(self) if "=" not in g))
        if not named:
            return
        try:
            conn, bound = connection.bind(connection.Endpoint.of(self), self.lookup_dn_search_user or None,
                                          self.lookup_dn_search_password or None)
            try:
                if not bound:
                    raise DirectoryUnavailable("the lookup account could not bind")
                carried = {n: group_carriers(self, conn, n) for n in named}
            finally:
                connection.close(conn)
        except DirectoryUnavailable as e:
            self.log.warning("Could not check at start that the admin groups %s name one directory group "
                             "each (%s); each login checks it.", ", ".join(named), e)
            return
        ambiguous = {n: dns for n, dns in carried.items() if len(dns) > 1}
        if ambiguous:
            listing = "; ".join(f"{n!r} is carried by {len(dns)} directory groups: {' | '.join(dns)}"
                                for n, dns in ambiguous.items())
            raise DirectoryConfigError(
                f"{type(self).__name__}: a privileged group is named by a name that several directory "
                f"groups carry, so anyone who can create a group could borrow its rights: {listing}. "
                "Name the group meant by its DN (GPUHUB_DIRECTORY_ADMIN_GROUPS / _EXEC_GROUPS take DNs "
                "separated by semicolons), then start the hub again.")

    async def check_allowed(self, username, auth_model):
        """Allowed by `allowed_users`, or by membership in one of `allowed_groups`."""
        if username in self.allowed_users:
            return True
        auth_state = (auth_model or {}).get("auth_state") or {}
        if self.allowed_groups and in_groups(self.allowed_groups, auth_state):
            return True
        if auth_model is not None:
            self._refuse(username, LoginRefused(f"not in {SETTING['allowed_groups']}", MSG_NOT_ALLOWED))
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
