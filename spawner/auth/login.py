"""One login against the directory, start to finish, blocking: run on a worker thread.

Input checks, the user's lookup, the password bind, account state, the search
filter and group membership (nesting followed), ending in JupyterHub's auth model.
"""

from __future__ import annotations

import re

import ldap3
from ldap3.utils.conv import escape_filter_chars
from ldap3.utils.dn import escape_rdn

from . import connection
from .entries import first, in_groups, int_or_none, norm_dn
from .kinds import KINDS, account_problem, bind_problem
from .messages import (
    MSG_ACCOUNT,
    MSG_BAD_NAME,
    MSG_LONG_NAME,
    MSG_MISCONFIGURED,
    MSG_NO_NAME,
    MSG_NO_PASSWORD,
    SETTING,
    LoginRefused,
)


class DirectoryLogin:
    """A login under the settings of the authenticator `a` (a DirectoryAuthenticator).

    Raises LoginRefused or DirectoryUnavailable; logs to `a.log`.
    """

    def __init__(self, a):
        self.a = a
        self.log = a.log
        self.endpoint = connection.Endpoint.of(a)

    def bind(self, user: str | None, password: str | None):
        return connection.bind(self.endpoint, user, password)

    def check_input(self, login: str, password: str | None) -> None:
        a = self.a
        if not login:
            raise LoginRefused("empty username", MSG_NO_NAME)
        if len(login) > a.max_username_length:
            raise LoginRefused(
                f"username of {len(login)} characters exceeds max_username_length",
                MSG_LONG_NAME.format(limit=a.max_username_length),
            )
        if not re.fullmatch(a.valid_username_regex, login):
            raise LoginRefused("username does not match valid_username_regex", MSG_BAD_NAME)
        # An empty password would make an LDAP "unauthenticated bind", which
        # many directories answer with success: never send one.
        if password is None or not password.strip():
            raise LoginRefused("blank password", MSG_NO_PASSWORD)

    def lookup(self, conn, login: str) -> tuple[str, str]:
        """The user's (DN, account name) found by the lookup filter."""
        a = self.a
        flt = a.lookup_dn_search_filter.format(
            login_attr=a.user_attribute, login=escape_filter_chars(login)
        )
        attr = a.lookup_dn_user_dn_attribute
        entries = connection.search(conn, a.user_search_base, flt, [attr], size_limit=2)
        if not entries:
            raise LoginRefused("no such user in the directory")
        if len(entries) > 1:
            self.log.error("Lookup filter %s matches several entries; it must match one.", flt)
            raise LoginRefused("lookup matched several entries")
        dn, attrs = entries[0]
        name = first(attrs, attr)
        if not name:
            self.log.error("Entry %s has no %s (lookup_dn_user_dn_attribute).", dn, attr)
            raise LoginRefused(f"entry has no {attr}")
        return dn, name

    def entry_attributes(self, conn, dn: str) -> dict:
        a = self.a
        attrs = [a.uid_number_attribute, a.gid_number_attribute, *a.auth_state_attributes,
                 *KINDS[a.directory].account_attributes]
        entries = connection.search(conn, dn, "(objectClass=*)", attrs, scope=ldap3.BASE)
        if not entries:
            self.log.warning("Could not read the entry %s: no uid/gid for this login.", dn)
            return {}
        return dict(entries[0][1])

    def bind_user(self, dn: str, password: str):
        """Bind as the user: the password check.  Returns the bound connection.

        AD tells why it refused a correct password ("data 533": disabled, ...);
        that is passed on.  Any other refusal gets the generic message, even when
        the entry's attributes say the account is disabled: the password was not
        proven, and the form must not tell strangers which accounts exist.
        """
        conn, bound = self.bind(dn, password)
        if bound:
            return conn
        result = conn.result or {}
        connection.close(conn)
        problem = bind_problem(result.get("message"))
        if problem:
            raise LoginRefused(f"account {problem} (directory: {result.get('message')})",
                               MSG_ACCOUNT[problem])
        raise LoginRefused(f"bind refused: {result.get('description')}")

    def groups(self, conn, user_dn: str, uid: str) -> dict[str, str]:
        """{group DN: group name} of every group the user is in, nesting followed."""
        a = self.a
        base = a.group_search_base or a.user_search_base
        name_attr = a.group_name_attribute
        flt = a.group_search_filter.format(
            userdn=escape_filter_chars(user_dn), uid=escape_filter_chars(uid)
        )
        found: dict[str, tuple[str, str]] = {}  # normalized DN -> (DN, name)

        def add(entries) -> list[str]:
            new = []
            for dn, attrs in entries:
                key = norm_dn(dn)
                if key not in found:
                    rdn_value = dn.split(",", 1)[0].split("=", 1)[-1]
                    found[key] = (dn, first(attrs, name_attr) or rdn_value)
                    new.append(dn)
            return new

        frontier = add(connection.search(conn, base, flt, [name_attr]))
        for _ in range(a.group_nesting_depth):
            if not frontier:
                break
            parts = "".join(
                a.group_nesting_filter.format(groupdn=escape_filter_chars(g)) for g in frontier
            )
            frontier = add(connection.search(conn, base, f"(|{parts})", [name_attr]))
        return dict(found.values())

    def carriers(self, conn, names: list[str]) -> dict[str, list[str]]:
        """{lower-case name: DNs of every directory group carrying it} for name-form groups."""
        return {n.lower(): group_carriers(self.a, conn, n) for n in dict.fromkeys(names)}

    def run(self, login: str, password: str | None) -> dict:
        """The whole login against the directory: JupyterHub's auth model."""
        a = self.a
        self.check_input(login, password)
        assert password is not None  # check_input refuses a missing password
        service = user_conn = None
        try:
            if a.lookup_dn:
                service, bound = self.bind(a.lookup_dn_search_user, a.lookup_dn_search_password)
                if not bound:
                    self.log.error(
                        "The lookup account %r could not bind: %s. Check %s and its password (%s).",
                        a.lookup_dn_search_user, service.result.get("description"),
                        SETTING["lookup_dn_search_user"], SETTING["lookup_dn_search_password"],
                    )
                    raise LoginRefused("lookup bind failed", MSG_MISCONFIGURED, 503)
                dn, name = self.lookup(service, login)
                attrs = self.entry_attributes(service, dn)
                user_conn = self.bind_user(dn, password)
            else:
                name = login
                for template in a.bind_dn_template:
                    dn = template.format(username=escape_rdn(login))
                    conn, bound = self.bind(dn, password)
                    if bound:
                        user_conn = conn
                        break
                    connection.close(conn)
                if user_conn is None:
                    raise LoginRefused("no bind_dn_template bound with this password")
                attrs = self.entry_attributes(user_conn, dn)
            # The password is proven: now the account's state may be told.
            problem = account_problem(a.directory, attrs)
            if problem:
                raise LoginRefused(f"account {problem} (userAccountControl)", MSG_ACCOUNT[problem])
            reader = service or user_conn
            if a.search_filter:
                flt = a.search_filter.format(
                    userattr=a.user_attribute, username=escape_filter_chars(name)
                )
                if len(connection.search(reader, a.user_search_base, flt, [],
                                         size_limit=2)) != 1:
                    raise LoginRefused("search_filter does not match exactly this user")
            groups = self.groups(reader, dn, name)
            # Privileged groups named by name are decided by DN: look up who carries each name.
            carried = self.carriers(reader, [g for g in privileged_groups(a) if "=" not in g])
        finally:
            connection.close(service)
            connection.close(user_conn)

        for group, dns in carried.items():
            if len(dns) > 1:
                self.log.error("%d directory groups are named %r (%s): it grants nothing until the "
                               "setting names the one meant by its DN.", len(dns), group, "; ".join(dns))
        # A directory group named like a hub group the login fills by DN decision is not synced
        # under that name (it would borrow the role the hub group carries).
        reserved = {k.lower() for k in a.role_groups}
        names = sorted({g for g in groups.values() if g.lower() not in reserved})
        auth_state = {
            "dn": dn,
            "uid_number": int_or_none(first(attrs, a.uid_number_attribute)),
            "gid_number": int_or_none(first(attrs, a.gid_number_attribute)),
            "groups": names,
            "group_dns": sorted(groups),
            "directory": a.directory,
        }
        if a.auth_state_attributes:
            auth_state["user_attributes"] = {
                k: attrs.get(k) for k in a.auth_state_attributes if k in attrs
            }
        if not a.use_lookup_dn_username:
            name = login
        admin = None
        if a.admin_groups:
            admin = in_groups(a.admin_groups, auth_state, names=carried) or (
                a.normalize_username(name) in a.admin_users
            )
        hub_groups = names + sorted(k for k, wanted in a.role_groups.items()
                                    if in_groups(wanted, auth_state, names=carried))
        return {"name": name, "admin": admin, "groups": hub_groups, "auth_state": auth_state}


# Every kind of group entry the two directory kinds have.
GROUP_CLASSES = ("(|(objectClass=groupOfNames)(objectClass=groupOfUniqueNames)(objectClass=posixGroup)"
                 "(objectClass=group))")


def privileged_groups(a) -> list[str]:
    """The groups that grant rights: `admin_groups` and every group of `role_groups`."""
    return [*a.admin_groups, *(g for wanted in a.role_groups.values() for g in wanted)]


def group_carriers(a, conn, name: str) -> list[str]:
    """The DNs of the directory groups whose name (`group_name_attribute`) is `name`."""
    flt = f"(&{GROUP_CLASSES}({a.group_name_attribute}={escape_filter_chars(name)}))"
    return sorted(dn for dn, _ in connection.search(conn, a.group_search_base or a.user_search_base, flt, []))
