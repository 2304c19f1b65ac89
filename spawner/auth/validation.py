"""Checks at start that DirectoryAuthenticator's settings can work.

A configuration that cannot log anyone in stops the hub with DirectoryConfigError
naming the setting to fix, instead of failing each login later.
"""

from __future__ import annotations

import os
import re

from ldapauthenticator.ldapauthenticator import TlsStrategy

from .kinds import ACTIVE_DIRECTORY
from .messages import DirectoryConfigError


def validate_config(a) -> None:
    """Refuse configurations of the authenticator `a` that cannot work, naming the setting."""
    cls = type(a).__name__
    if not a.server_address:
        raise DirectoryConfigError(
            f"{cls}.server_address is empty: set it to the directory's host name."
        )
    if a.tls_strategy == TlsStrategy.insecure:
        if not a.allow_plaintext:
            raise DirectoryConfigError(
                f'{cls}.tls_strategy = "insecure" sends passwords unencrypted. Use '
                '"before_bind" (StartTLS) or "on_connect" (LDAPS) with tls_ca_file, or '
                f"set {cls}.allow_plaintext = True if plain LDAP is really intended."
            )
        a.log.warning(
            "%s: plain LDAP to %s:%s; passwords cross the network unencrypted.",
            cls, a.server_address, a.server_port,
        )
    if a.tls_ca_file and not os.access(a.tls_ca_file, os.R_OK):
        raise DirectoryConfigError(
            f"{cls}.tls_ca_file = {a.tls_ca_file!r} is not a readable file."
        )
    if not a.lookup_dn and not a.bind_dn_template:
        raise DirectoryConfigError(
            f"{cls} needs lookup_dn = True (with user_search_base) or bind_dn_template."
        )
    if a.directory == ACTIVE_DIRECTORY and not a.lookup_dn:
        raise DirectoryConfigError(
            f'{cls}.directory = "active_directory" needs lookup_dn = True: AD users are '
            "found by sAMAccountName or userPrincipalName."
        )
    if a.lookup_dn and not a.user_search_base:
        raise DirectoryConfigError(
            f"{cls}.lookup_dn needs user_search_base (e.g. ou=people,dc=example,dc=com)."
        )
    if a.lookup_dn_search_user and a.lookup_dn_search_password is None:
        raise DirectoryConfigError(
            f"{cls}.lookup_dn_search_user is set but lookup_dn_search_password is not."
        )
    for name in ("connect_timeout", "read_timeout"):
        if not getattr(a, name) > 0:
            raise DirectoryConfigError(f"{cls}.{name} must be a positive number of seconds.")
    if a.executor_threads < 1 or a.max_username_length < 1:
        raise DirectoryConfigError(
            f"{cls}.executor_threads and max_username_length must be at least 1."
        )
    if a.group_nesting_depth < 0:
        raise DirectoryConfigError(f"{cls}.group_nesting_depth must be 0 or more.")
    try:
        re.compile(a.valid_username_regex)
    except re.error as e:
        raise DirectoryConfigError(f"{cls}.valid_username_regex does not compile: {e}") from None
    needs_groups = a.manage_groups or a.allowed_groups or a.admin_groups
    if needs_groups and not (a.group_search_base or a.user_search_base):
        raise DirectoryConfigError(f"{cls}.group_search_base is needed to find groups.")
