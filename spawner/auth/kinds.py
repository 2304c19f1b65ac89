"""How Active Directory and OpenLDAP differ, as data and pure functions.

Default filters, attribute names and username syntax per directory kind, and the
decoding of AD's account state (userAccountControl bits, bind sub-codes); no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .entries import first, int_or_none

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

_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"


@dataclass(frozen=True)
class DirectoryKind:
    """A directory kind's defaults for DirectoryAuthenticator's settings."""

    user_attribute: str
    lookup_dn_search_filter: str
    group_search_filter: str
    group_nesting_depth: int
    valid_username_regex: str
    # Read with the user's entry to tell why the account may not log in.
    account_attributes: tuple[str, ...] = ()


KINDS = {
    ACTIVE_DIRECTORY: DirectoryKind(
        user_attribute="sAMAccountName",
        lookup_dn_search_filter=(
            "(&(objectCategory=person)(objectClass=user)"
            "(|(sAMAccountName={login})(userPrincipalName={login})))"
        ),
        # Every group, nested ones included, in one search: nothing left to follow.
        group_search_filter=f"(&(objectClass=group)(member:{IN_CHAIN}:={{userdn}}))",
        group_nesting_depth=0,
        valid_username_regex=rf"{_NAME}(@[A-Za-z0-9][A-Za-z0-9.-]*)?",  # sAMAccountName or UPN
        # The computed attribute is only returned for a base-scope read.
        account_attributes=("userAccountControl", "lockoutTime",
                            "msDS-User-Account-Control-Computed"),
    ),
    OPENLDAP: DirectoryKind(
        user_attribute="uid",
        lookup_dn_search_filter="({login_attr}={login})",
        group_search_filter="(|(member={userdn})(uniqueMember={userdn})(memberUid={uid}))",
        group_nesting_depth=8,
        valid_username_regex=_NAME,
    ),
}


def account_problem(kind: str, attrs: dict) -> str | None:
    """Why AD will not let this account log in, from its attributes, or None."""
    if kind != ACTIVE_DIRECTORY:
        return None
    uac = int_or_none(first(attrs, "userAccountControl")) or 0
    if uac & UF_ACCOUNTDISABLE:
        return "disabled"
    computed = int_or_none(first(attrs, "msDS-User-Account-Control-Computed"))
    if computed is not None:
        if computed & UF_LOCKOUT:
            return "locked"
        if computed & UF_PASSWORD_EXPIRED:
            return "password_expired"
    elif (int_or_none(first(attrs, "lockoutTime")) or 0) > 0:
        return "locked"  # directories without the computed attribute
    return None


def bind_problem(message: str | None) -> str | None:
    """Why AD refused a correct password, from its bind result message, or None."""
    match = re.search(r"data ([0-9a-f]{3})", message or "")
    return AD_BIND_CODES.get(match.group(1)) if match else None
