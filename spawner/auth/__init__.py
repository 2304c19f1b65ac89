"""Log in with Active Directory or OpenLDAP: groups, admin rights and the Unix identity.

This package is what `spawner.auth` always was; its modules each hold one part:
authenticator (settings, JupyterHub's calls), login (one login's directory work),
kinds (AD vs OpenLDAP as data), connection (TLS, bind, search), validation (settings
checked at start), messages (what a refusal says), entries (attribute values, DNs).

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

from .authenticator import DirectoryAuthenticator
from .kinds import (
    ACTIVE_DIRECTORY,
    AD_BIND_CODES,
    IN_CHAIN,
    OPENLDAP,
    UF_ACCOUNTDISABLE,
    UF_LOCKOUT,
    UF_PASSWORD_EXPIRED,
)
from .messages import (
    MSG_ACCOUNT,
    MSG_BAD_NAME,
    MSG_LONG_NAME,
    MSG_MISCONFIGURED,
    MSG_NO_NAME,
    MSG_NO_PASSWORD,
    MSG_NOT_ALLOWED,
    MSG_UNAVAILABLE,
    DirectoryConfigError,
    DirectoryUnavailable,
    LoginRefused,
)

__all__ = [
    "ACTIVE_DIRECTORY",
    "AD_BIND_CODES",
    "IN_CHAIN",
    "MSG_ACCOUNT",
    "MSG_BAD_NAME",
    "MSG_LONG_NAME",
    "MSG_MISCONFIGURED",
    "MSG_NOT_ALLOWED",
    "MSG_NO_NAME",
    "MSG_NO_PASSWORD",
    "MSG_UNAVAILABLE",
    "OPENLDAP",
    "UF_ACCOUNTDISABLE",
    "UF_LOCKOUT",
    "UF_PASSWORD_EXPIRED",
    "DirectoryAuthenticator",
    "DirectoryConfigError",
    "DirectoryUnavailable",
    "LoginRefused",
]
