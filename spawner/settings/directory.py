"""The directory login's settings: GPUHUB_DIRECTORY_* checked, and JUPYTERHUB_CRYPT_KEY.

DirectorySettings is what they add up to, and turns itself into traits for
spawner.auth.DirectoryAuthenticator (this module imports nothing of spawner.auth).
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .parsing import SettingsError, env_bool, env_choice, env_groups, env_int


@dataclass(frozen=True)
class DirectorySettings:
    """Where the directory login (GPUHUB_AUTHENTICATOR=ldap) looks users up.

    `bind_password` is kept out of repr(), so printing the settings never
    shows it.
    """

    kind: str  # "openldap" or "active_directory"
    server: str
    port: int
    tls: str  # "ldaps", "starttls" or "plain"
    ca_file: str = ""
    tls_server_name: str = ""
    bind_dn: str = ""
    bind_password: str = field(default="", repr=False)
    # The file it was read from (GPUHUB_DIRECTORY_BIND_PASSWORD_FILE), absolute; "" when given inline.
    bind_password_file: str = ""
    user_base: str = ""
    group_base: str = ""
    allowed_groups: tuple[str, ...] = ()
    admin_groups: tuple[str, ...] = ()
    exec_groups: tuple[str, ...] = ()  # may run action scripts in other people's servers
    allow_plaintext: bool = False

    def authenticator_config(self) -> dict:
        """Traits for spawner.auth.DirectoryAuthenticator."""
        strategy = {"ldaps": "on_connect", "starttls": "before_bind", "plain": "insecure"}[self.tls]
        cfg: dict = {
            "directory": self.kind,
            "server_address": self.server,
            "server_port": self.port,
            "tls_strategy": strategy,
            "allow_plaintext": self.tls == "plain",
            "lookup_dn": True,
            "user_search_base": self.user_base,
            "group_search_base": self.group_base or self.user_base,
            "allowed_groups": list(self.allowed_groups),
            "admin_groups": list(self.admin_groups),
        }
        if self.ca_file:
            cfg["tls_ca_file"] = self.ca_file
        if self.tls_server_name:
            cfg["tls_kwargs"] = {"valid_names": [self.tls_server_name]}
        if self.bind_dn:
            cfg["lookup_dn_search_user"] = self.bind_dn
            cfg["lookup_dn_search_password"] = self.bind_password
        return cfg


DIRECTORY_KINDS = ("openldap", "active_directory")
TLS_MODES = ("ldaps", "starttls", "plain")
# The variables that only mean something with GPUHUB_DIRECTORY set.
DIRECTORY_VARS = (
    "GPUHUB_DIRECTORY_SERVER", "GPUHUB_DIRECTORY_PORT", "GPUHUB_DIRECTORY_TLS",
    "GPUHUB_DIRECTORY_CA_FILE", "GPUHUB_DIRECTORY_TLS_SERVER_NAME",
    "GPUHUB_DIRECTORY_ALLOW_PLAINTEXT", "GPUHUB_DIRECTORY_BIND_DN",
    "GPUHUB_DIRECTORY_BIND_PASSWORD", "GPUHUB_DIRECTORY_BIND_PASSWORD_FILE",
    "GPUHUB_DIRECTORY_USER_BASE", "GPUHUB_DIRECTORY_GROUP_BASE",
    "GPUHUB_DIRECTORY_ALLOWED_GROUPS", "GPUHUB_DIRECTORY_ADMIN_GROUPS", "GPUHUB_DIRECTORY_EXEC_GROUPS",
)


def bind_password_setting(env: Mapping[str, str]) -> str:
    """GPUHUB_DIRECTORY_BIND_PASSWORD, or the contents of GPUHUB_DIRECTORY_BIND_PASSWORD_FILE.

    No message here ever contains the password itself.
    """
    inline = env.get("GPUHUB_DIRECTORY_BIND_PASSWORD", "")
    path = env.get("GPUHUB_DIRECTORY_BIND_PASSWORD_FILE", "").strip()
    if inline and path:
        raise SettingsError(
            "GPUHUB_DIRECTORY_BIND_PASSWORD and GPUHUB_DIRECTORY_BIND_PASSWORD_FILE are both set; "
            "set only one (the file is the safer choice)")
    if not path:
        return inline
    try:
        # One trailing newline is what `echo secret > file` leaves; it is not
        # part of the password.
        password = Path(path).read_text().removesuffix("\n").removesuffix("\r")
    except OSError as exc:
        raise SettingsError(
            f"GPUHUB_DIRECTORY_BIND_PASSWORD_FILE={path!r} cannot be read: {exc.strerror}") from None
    if not password:
        raise SettingsError(f"GPUHUB_DIRECTORY_BIND_PASSWORD_FILE={path!r} is empty")
    return password


def check_crypt_key(env: Mapping[str, str]) -> None:
    """The directory login keeps uid/gid and groups in auth_state, which
    JupyterHub stores encrypted with JUPYTERHUB_CRYPT_KEY (one key, or several
    separated by ';' while rotating).  Checked here so the hub stops with a
    message that says what to do, before anything starts."""
    raw = env.get("JUPYTERHUB_CRYPT_KEY", "").strip()
    if not raw:
        raise SettingsError(
            "JUPYTERHUB_CRYPT_KEY is not set: the directory login stores each user's uid/gid and "
            "groups encrypted with it. Create one with `openssl rand -hex 32` and keep it "
            "(a new key makes the stored state unreadable; users then log in again)")
    for i, key in enumerate(k.strip() for k in raw.split(";") if k.strip()):
        try:
            decoded = binascii.a2b_hex(key)
        except (binascii.Error, ValueError):
            try:
                decoded = base64.urlsafe_b64decode(key)
            except (binascii.Error, ValueError):
                decoded = b""
        if len(decoded) != 32:
            # Never echo the key.
            raise SettingsError(
                f"JUPYTERHUB_CRYPT_KEY: key {i + 1} is not 32 bytes of hex or base64 "
                "(create one with `openssl rand -hex 32`)")


def load_directory_settings(env: Mapping[str, str]) -> DirectorySettings | None:
    """The GPUHUB_DIRECTORY_* settings; None when GPUHUB_DIRECTORY is unset.

    Unset means the directory is configured in a config file loaded after
    jupyterhub_config.py (c.DirectoryAuthenticator..., see hub_config/examples/).
    """
    raw_kind = env.get("GPUHUB_DIRECTORY", "").strip().lower()
    if not raw_kind:
        stray = [name for name in DIRECTORY_VARS if env.get(name, "").strip()]
        if stray:
            raise SettingsError(
                f"{stray[0]} is set but GPUHUB_DIRECTORY is not: set GPUHUB_DIRECTORY to "
                f"{' or '.join(DIRECTORY_KINDS)}")
        return None
    kind = env_choice(env, "GPUHUB_DIRECTORY", "", DIRECTORY_KINDS)

    server = env.get("GPUHUB_DIRECTORY_SERVER", "").strip()
    if not server:
        raise SettingsError(
            "GPUHUB_DIRECTORY_SERVER is not set: the directory's host name, e.g. ldap.example.com")
    if "://" in server or "/" in server:
        raise SettingsError(
            f"GPUHUB_DIRECTORY_SERVER={server!r} must be a host name only; "
            "the port goes in GPUHUB_DIRECTORY_PORT and TLS in GPUHUB_DIRECTORY_TLS")

    # Active Directory refuses simple binds without TLS; LDAPS is its usual
    # port.  OpenLDAP is usually StartTLS on 389.
    tls = env_choice(env, "GPUHUB_DIRECTORY_TLS", "ldaps" if kind == "active_directory" else "starttls",
                  TLS_MODES)
    allow_plaintext = env_bool(env, "GPUHUB_DIRECTORY_ALLOW_PLAINTEXT", False)
    ca_file = env.get("GPUHUB_DIRECTORY_CA_FILE", "").strip()
    if tls == "plain":
        if not allow_plaintext:
            raise SettingsError(
                "GPUHUB_DIRECTORY_TLS=plain sends passwords unencrypted: use ldaps or starttls, "
                "or also set GPUHUB_DIRECTORY_ALLOW_PLAINTEXT=true if that is really intended")
        if ca_file:
            raise SettingsError(
                "GPUHUB_DIRECTORY_CA_FILE is set but GPUHUB_DIRECTORY_TLS=plain uses no TLS")
    elif allow_plaintext:
        raise SettingsError(
            f"GPUHUB_DIRECTORY_ALLOW_PLAINTEXT=true contradicts GPUHUB_DIRECTORY_TLS={tls}; "
            "remove it")
    if ca_file and not os.access(ca_file, os.R_OK):
        raise SettingsError(f"GPUHUB_DIRECTORY_CA_FILE={ca_file!r} is not a readable file")
    port = env_int(env, "GPUHUB_DIRECTORY_PORT", 636 if tls == "ldaps" else 389, minimum=1)
    if port > 65535:
        raise SettingsError(f"GPUHUB_DIRECTORY_PORT={port} is not a TCP port")

    bind_dn = env.get("GPUHUB_DIRECTORY_BIND_DN", "").strip()
    bind_password = bind_password_setting(env)
    if bind_dn and not bind_password:
        raise SettingsError(
            "GPUHUB_DIRECTORY_BIND_DN is set but neither GPUHUB_DIRECTORY_BIND_PASSWORD nor "
            "GPUHUB_DIRECTORY_BIND_PASSWORD_FILE is")
    if bind_password and not bind_dn:
        raise SettingsError(
            "a service account password is set but GPUHUB_DIRECTORY_BIND_DN (whose password "
            "it is) is not")
    if kind == "active_directory" and not bind_dn:
        raise SettingsError(
            "GPUHUB_DIRECTORY=active_directory needs GPUHUB_DIRECTORY_BIND_DN (a read-only "
            "service account): Active Directory does not answer anonymous searches")

    user_base = env.get("GPUHUB_DIRECTORY_USER_BASE", "").strip()
    if not user_base:
        raise SettingsError(
            "GPUHUB_DIRECTORY_USER_BASE is not set: where users are searched, "
            "e.g. ou=people,dc=example,dc=com")
    allowed = env_groups(env, "GPUHUB_DIRECTORY_ALLOWED_GROUPS")
    if not allowed:
        raise SettingsError(
            "GPUHUB_DIRECTORY_ALLOWED_GROUPS is empty: name the groups whose members may use the "
            "hub (names separated by commas, or DNs separated by semicolons)")
    return DirectorySettings(
        kind=kind,
        server=server,
        port=port,
        tls=tls,
        ca_file=ca_file,
        tls_server_name=env.get("GPUHUB_DIRECTORY_TLS_SERVER_NAME", "").strip(),
        bind_dn=bind_dn,
        bind_password=bind_password,
        bind_password_file=str(Path(path).resolve()) if (path := env.get(
            "GPUHUB_DIRECTORY_BIND_PASSWORD_FILE", "").strip()) else "",
        user_base=user_base,
        group_base=env.get("GPUHUB_DIRECTORY_GROUP_BASE", "").strip() or user_base,
        allowed_groups=allowed,
        admin_groups=env_groups(env, "GPUHUB_DIRECTORY_ADMIN_GROUPS"),
        exec_groups=env_groups(env, "GPUHUB_DIRECTORY_EXEC_GROUPS"),
        allow_plaintext=allow_plaintext,
    )
