"""DirectoryAuthenticator without a directory: configuration, defaults, input checks.

Input checks must refuse before any traffic: every authenticator here points at
a port nobody listens on, so reaching the directory would show up as the
"cannot reach the login directory" message instead of the expected one.
"""

from __future__ import annotations

import asyncio
import logging
import ssl

import pytest
from tornado import web
from traitlets.config import Config

from spawner import auth
from spawner.auth import DirectoryAuthenticator, DirectoryConfigError
from tests.fixtures.services import free_port


def make(**traits) -> DirectoryAuthenticator:
    base = {
        "server_address": "127.0.0.1",
        "server_port": free_port(),  # nothing listens there
        "user_search_base": "ou=people,dc=example,dc=com",
        "connect_timeout": 2.0,
    }
    base.update(traits)
    return DirectoryAuthenticator(config=Config({"DirectoryAuthenticator": base}))


def login(authenticator, username, password):
    """The login form's path: the auth model, None, or the HTTPError the form shows."""
    async def go():
        return await authenticator.get_authenticated_user(
            None, {"username": username, "password": password}
        )
    try:
        return asyncio.run(go())
    except web.HTTPError as e:
        return e


def test_openldap_defaults():
    a = make()
    assert a.directory == "openldap"
    assert a.user_attribute == "uid"
    assert a.lookup_dn and a.use_lookup_dn_username
    assert "memberUid={uid}" in a.group_search_filter and "member={userdn}" in a.group_search_filter
    assert a.group_nesting_depth > 0
    assert a.manage_groups and a.enable_auth_state
    assert not a.allow_plaintext


def test_active_directory_defaults():
    a = make(directory="Active_Directory")  # the kind is case-insensitive
    assert a.directory == "active_directory"
    assert a.user_attribute == "sAMAccountName"
    assert "userPrincipalName={login}" in a.lookup_dn_search_filter
    assert "sAMAccountName={login}" in a.lookup_dn_search_filter
    assert f"member:{auth.IN_CHAIN}:={{userdn}}" in a.group_search_filter
    assert a.group_nesting_depth == 0  # the directory resolves nesting itself


def test_explicit_settings_win_over_kind_defaults():
    a = make(directory="active_directory", user_attribute="cn", group_nesting_depth=3)
    assert (a.user_attribute, a.group_nesting_depth) == ("cn", 3)


def test_unknown_directory_kind_is_refused():
    with pytest.raises(Exception, match="openldap"):
        make(directory="novell")


def test_plain_ldap_refused_unless_allowed(caplog):
    with pytest.raises(DirectoryConfigError, match="allow_plaintext"):
        make(tls_strategy="insecure")
    caplog.set_level(logging.WARNING)
    a = make(tls_strategy="insecure", allow_plaintext=True)
    assert a.allow_plaintext
    assert "unencrypted" in caplog.text


@pytest.mark.parametrize(
    "traits, setting",
    [
        ({"server_address": ""}, "server_address"),
        ({"tls_ca_file": "/nonexistent/ca.pem"}, "tls_ca_file"),
        ({"user_search_base": None}, "user_search_base"),
        ({"lookup_dn": False}, "bind_dn_template"),
        ({"directory": "active_directory", "lookup_dn": False,
          "bind_dn_template": ["{username}@example.com"]}, "lookup_dn"),
        ({"lookup_dn_search_user": "cn=svc,dc=example,dc=com"}, "lookup_dn_search_password"),
        ({"connect_timeout": 0.0}, "connect_timeout"),
        ({"read_timeout": -1}, "read_timeout"),
        ({"valid_username_regex": "[a-"}, "valid_username_regex"),
    ],
)
def test_unworkable_config_names_the_setting(traits, setting):
    with pytest.raises(DirectoryConfigError, match=setting):
        make(**traits)


def test_ca_file_and_verification_reach_ldap3(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("not parsed until a connection is made\n")
    server = make(tls_ca_file=str(ca), tls_strategy="on_connect")._server()
    assert server.ssl and server.tls.ca_certs_file == str(ca)
    assert server.tls.validate == ssl.CERT_REQUIRED  # ldap3's own default is CERT_NONE
    # StartTLS (the default strategy) also verifies; plain LDAP has no TLS at all.
    assert make()._server().tls.validate == ssl.CERT_REQUIRED
    assert make(tls_strategy="insecure", allow_plaintext=True)._server().tls is None


@pytest.mark.parametrize("password", ["", " ", "\t\n ", None])
def test_blank_password_refused_before_the_directory(password):
    result = login(make(), "alice", password)
    assert isinstance(result, web.HTTPError) and result.status_code == 403
    assert result.log_message == auth.MSG_NO_PASSWORD


@pytest.mark.parametrize(
    "username", ["*", "al*", "alice)(uid=*", "(alice", "alice\\", "al\x00ice", "alice,ou=x", "a b"]
)
def test_filter_metacharacters_refused_before_the_directory(username):
    result = login(make(), username, "Secret-123")
    assert isinstance(result, web.HTTPError) and result.status_code == 403
    assert result.log_message == auth.MSG_BAD_NAME


def test_upn_accepted_only_for_active_directory():
    assert login(make(), "alice@example.com", "x").log_message == auth.MSG_BAD_NAME
    # For AD the name passes the checks and the (absent) directory is asked.
    result = login(make(directory="active_directory"), "alice@example.com", "x")
    assert result.status_code == 503 and result.log_message == auth.MSG_UNAVAILABLE


def test_long_username_refused_with_limit():
    a = make(max_username_length=20)
    result = login(a, "a" * 21, "Secret-123")
    assert result.status_code == 403 and "at most 20 characters" in result.log_message
    result = login(make(), "a" * 100_000, "Secret-123")
    assert "at most 64 characters" in result.log_message


def test_empty_username_refused():
    assert login(make(), "   ", "Secret-123").log_message == auth.MSG_NO_NAME


def test_authenticate_itself_returns_none_on_refusal():
    assert asyncio.run(make().authenticate(None, {"username": "*", "password": "x"})) is None


def test_no_password_in_logs_of_refusals(caplog):
    caplog.set_level(logging.DEBUG)
    secret = "Pw-nobody-may-read-42"
    a = make(directory="active_directory")
    for name in ["*", "alice", "a" * 200, "alice@example.com"]:
        login(a, name, secret)
    assert caplog.records  # the refusals were logged...
    assert secret not in caplog.text  # ...without the password


@pytest.mark.parametrize(
    "allowed, expect",
    [
        (["gpu-users"], True),
        (["GPU-Users"], True),  # names compare case-insensitively
        (["cn=gpu-users,ou=groups,dc=example,dc=com"], True),
        (["CN=GPU-users, OU=groups, DC=example, DC=com"], True),  # DN spelled differently
        (["cn=gpu-users,ou=other,dc=example,dc=com"], False),
        (["ml-team"], False),
    ],
)
def test_allowed_groups_by_name_or_dn(allowed, expect):
    a = make(allowed_groups=allowed)
    model = {"name": "alice", "auth_state": {
        "groups": ["gpu-users", "research"],
        "group_dns": ["cn=gpu-users,ou=groups,dc=example,dc=com",
                      "cn=research,ou=groups,dc=example,dc=com"],
    }}
    assert asyncio.run(a.check_allowed("alice", model)) is expect


def test_allowed_users_still_count():
    a = make(allowed_groups=["gpu-users"], allowed_users={"frank"})
    assert asyncio.run(a.check_allowed("frank", {"name": "frank", "auth_state": {}}))


@pytest.mark.parametrize("example, kind", [("openldap.py", "openldap"),
                                           ("active_directory.py", "active_directory")])
def test_hub_config_examples_load(example, kind, tmp_path, monkeypatch):
    from pathlib import Path

    from traitlets.config import PyFileConfigLoader

    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    for var in ("LDAP_BIND_PASSWORD", "AD_BIND_PASSWORD"):
        monkeypatch.setenv(var, "example-secret")
    for var in ("LDAP_CA_FILE", "AD_CA_FILE"):
        monkeypatch.setenv(var, str(ca))
    examples = Path(__file__).resolve().parents[2] / "hub_config" / "examples"
    cfg = PyFileConfigLoader(example, path=str(examples)).load_config()
    a = DirectoryAuthenticator(config=cfg)
    assert cfg.JupyterHub.authenticator_class == "gpu-directory"
    assert a.directory == kind and a.tls_ca_file == str(ca)
    assert a.allowed_groups and a.admin_groups and a.tls_strategy.name != "insecure"
