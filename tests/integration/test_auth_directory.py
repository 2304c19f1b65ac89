"""DirectoryAuthenticator against real directories: OpenLDAP and Samba AD on 127.0.0.1.

Every test that takes `directory` runs against both.  Users, passwords, groups
and uid/gid numbers come from the fixture (devservices/ldap/seed.py).
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from tornado import web
from traitlets.config import Config

from devservices.ldap.common import Directory
from devservices.ldap.tls import make_ca
from spawner import auth
from spawner.auth import DirectoryAuthenticator


def make(directory: Directory, tls: str = "starttls", **overrides) -> DirectoryAuthenticator:
    traits = directory.authenticator_config(tls, **overrides)
    return DirectoryAuthenticator(config=Config({"DirectoryAuthenticator": traits}))


async def _login(authenticator, username, password):
    try:
        return await authenticator.get_authenticated_user(
            None, {"username": username, "password": password}
        )
    except web.HTTPError as e:
        return e


def login(authenticator, username, password):
    """The login form's path: the auth model, None (generic message), or the HTTPError
    whose message the form shows.  Bounded, so a hang fails the test instead of the run."""
    return asyncio.run(asyncio.wait_for(_login(authenticator, username, password), 60))


def allowed_users(directory: Directory):
    return [u for u in directory.users.values()
            if directory.allowed_group in directory.groups_of(u.name)
            and not u.ad_only]


@pytest.mark.parametrize("tls", ["starttls", "ldaps"])
def test_login_returns_groups_admin_and_unix_identity(directory, tls):
    a = make(directory, tls)
    users = allowed_users(directory)
    assert {"alice", "bob", "carol"} <= {u.name for u in users}
    for user in users:
        model = login(a, user.name, user.password)
        assert isinstance(model, dict), f"{user.name}: {model!r}"
        expected_groups = sorted(directory.groups_of(user.name))
        assert model["name"] == user.name
        assert model["groups"] == expected_groups
        assert model["admin"] is (directory.admin_group in expected_groups)
        state = model["auth_state"]
        assert state["uid_number"] == user.uid_number
        assert state["gid_number"] == user.gid_number
        assert state["groups"] == expected_groups
        assert state["directory"] == directory.kind
        assert state["dn"].lower().endswith(directory.user_base.lower())
        assert len(state["group_dns"]) == len(expected_groups)


def test_nested_groups_are_found(directory):
    # alice is in gpu-users only through ml-team; carol only through hub-admins.
    alice = directory.users["alice"]
    model = login(make(directory), alice.name, alice.password)
    assert {"ml-team", "gpu-users"} <= set(model["groups"])
    assert alice.name not in directory.groups["gpu-users"].users  # only nested
    carol = directory.users["carol"]
    model = login(make(directory), carol.name, carol.password)
    assert {"hub-admins", "gpu-users"} <= set(model["groups"]) and model["admin"] is True


def test_user_without_unix_numbers_or_groups(directory):
    frank = directory.users["frank"]
    model = login(make(directory, allowed_groups=[], allow_all=True), frank.name, frank.password)
    assert model["auth_state"]["uid_number"] is None
    assert model["auth_state"]["gid_number"] is None
    assert model["groups"] == [] and model["admin"] is False


def test_user_outside_allowed_groups_is_told(directory):
    frank = directory.users["frank"]
    result = login(make(directory), frank.name, frank.password)
    assert isinstance(result, web.HTTPError) and result.status_code == 403
    assert result.log_message == auth.MSG_NOT_ALLOWED


def test_allowed_and_admin_groups_by_dn(directory):
    by_dn = {g: f"cn={g},{directory.group_base}" if directory.kind == "openldap"
             else f"CN={g},CN=Users,{directory.base_dn}" for g in directory.groups}
    a = make(directory, allowed_groups=[by_dn["ml-team"]], admin_groups=[by_dn["ml-team"]])
    alice, bob = directory.users["alice"], directory.users["bob"]
    assert login(a, alice.name, alice.password)["admin"] is True
    assert login(a, bob.name, bob.password).log_message == auth.MSG_NOT_ALLOWED


def test_name_case_and_ad_user_principal_name(directory):
    alice = directory.users["alice"]
    a = make(directory)
    assert login(a, alice.name.upper(), alice.password)["name"] == alice.name
    if directory.kind == "active_directory":
        model = login(a, f"{alice.name}@gpuhub.test", alice.password)
        assert model["name"] == alice.name  # the UPN logs in as the sAMAccountName


@pytest.mark.parametrize("who", ["wrong-password", "unknown-user"])
def test_wrong_password_or_unknown_user_gets_the_generic_message(directory, who):
    frank = directory.users["frank"]
    a = make(directory, allowed_groups=[], allow_all=True)
    name, password = (frank.name, "Not-" + frank.password) if who == "wrong-password" \
        else ("nobody-here", frank.password)
    assert login(a, name, password) is None  # JupyterHub: "Invalid username or password"
    assert asyncio.run(a.authenticate(None, {"username": name, "password": password})) is None


@pytest.mark.parametrize("password", ["", "   "])
def test_blank_password_never_binds(directory, password):
    # An empty simple bind is an "unauthenticated bind" that directories accept.
    alice = directory.users["alice"]
    result = login(make(directory), alice.name, password)
    assert result.status_code == 403 and result.log_message == auth.MSG_NO_PASSWORD


@pytest.mark.parametrize(
    "username", ["*", "a*", "*)(|(uid=*", "alice)(objectClass=*", "\\2a", "ali\x00ce", "alice\\"]
)
def test_filter_metacharacters_are_escaped(directory, username):
    # Let the odd names through the name check: the directory must still not
    # match them to anyone (escaping), so even alice's password logs nobody in.
    a = make(directory, valid_username_regex=r"(?s).*")
    assert login(a, username, directory.users["alice"].password) is None


def test_metacharacters_in_a_password_are_just_characters(directory):
    bob = directory.users["bob"]
    assert set("()*\\ ") <= set(bob.password)
    assert login(make(directory), bob.name, bob.password)["name"] == bob.name


def test_bind_dn_template_with_escaping(openldap):
    alice = openldap.users["alice"]
    a = make(openldap, lookup_dn=False, bind_dn_template=[f"uid={{username}},{openldap.user_base}"],
             valid_username_regex=r".*")
    model = login(a, alice.name, alice.password)
    assert model["auth_state"]["uid_number"] == alice.uid_number
    assert "ml-team" in model["groups"]
    # A name that would change the DN if it were not escaped.
    assert login(a, f"{alice.name},ou=people", alice.password) is None


def test_disabled_and_locked_ad_accounts_are_told(samba_ad):
    a = make(samba_ad)
    for user, problem in [(u, "disabled" if u.disabled else "locked")
                          for u in samba_ad.users.values() if u.ad_only]:
        result = login(a, user.name, user.password)
        assert isinstance(result, web.HTTPError), f"{user.name} logged in"
        assert result.log_message == auth.MSG_ACCOUNT[problem]


def test_disabled_account_state_not_told_without_the_password(samba_ad):
    dave = next(u for u in samba_ad.users.values() if u.disabled)
    assert login(make(samba_ad), dave.name, "Not-" + dave.password) is None


def test_plain_ldap_only_when_allowed(directory):
    alice = directory.users["alice"]
    a = make(directory, "plain")  # allow_plaintext=True
    result = login(a, alice.name, alice.password)
    if directory.kind == "openldap":
        assert result["name"] == alice.name
    else:
        # AD refuses simple binds without TLS ("strong auth required"): the
        # service account cannot bind, and the user is told the hub needs fixing.
        assert result.status_code == 503 and result.log_message == auth.MSG_MISCONFIGURED


def test_untrusted_certificate_refuses_login(directory, tmp_path, caplog):
    other_ca, _ = make_ca(tmp_path, "other-ca")
    alice = directory.users["alice"]
    for tls in ("starttls", "ldaps"):
        caplog.clear()
        result = login(make(directory, tls, tls_ca_file=str(other_ca)), alice.name, alice.password)
        assert result.status_code == 503 and result.log_message == auth.MSG_UNAVAILABLE
        assert "certif" in caplog.text.lower()


def test_service_account_with_wrong_password(directory, caplog):
    alice = directory.users["alice"]
    a = make(directory, lookup_dn_search_password="Not-" + directory.bind_password)
    result = login(a, alice.name, alice.password)
    assert result.status_code == 503 and result.log_message == auth.MSG_MISCONFIGURED
    # The log names what the admin edits: the settings of the service account.
    assert "GPUHUB_DIRECTORY_BIND_DN" in caplog.text and "GPUHUB_DIRECTORY_BIND_PASSWORD_FILE" in caplog.text
    assert directory.bind_password not in caplog.text


@pytest.mark.parametrize("tls", ["starttls", "ldaps", "plain"])
def test_directory_down(directory, dead_ldap_port, tls):
    alice = directory.users["alice"]
    a = make(directory, tls, server_port=dead_ldap_port, connect_timeout=2.0)
    result = login(a, alice.name, alice.password)
    assert result.status_code == 503 and result.log_message == auth.MSG_UNAVAILABLE


@pytest.mark.parametrize("tls", ["starttls", "ldaps"])
def test_directory_hangs_and_the_hub_keeps_serving(openldap, slow_ldap_server, tls):
    alice = openldap.users["alice"]
    slow = make(openldap, tls, server_port=slow_ldap_server, read_timeout=2, connect_timeout=2.0)
    healthy = make(openldap, tls)

    async def both():
        stuck = asyncio.ensure_future(_login(slow, alice.name, alice.password))
        fine = asyncio.ensure_future(_login(healthy, alice.name, alice.password))
        done, _ = await asyncio.wait({stuck, fine}, return_when=asyncio.FIRST_COMPLETED)
        # The event loop was free while a login waited on the hung directory.
        assert fine in done and stuck not in done
        return (await fine), (await stuck)

    fine, stuck = asyncio.run(asyncio.wait_for(both(), 60))
    assert fine["name"] == alice.name
    assert stuck.status_code == 503 and stuck.log_message == auth.MSG_UNAVAILABLE


def test_no_log_line_holds_a_password(directory, dead_ldap_port, slow_ldap_server, caplog):
    caplog.set_level(logging.DEBUG)
    users = directory.users
    a = make(directory)
    attempts = [(u.name, u.password) for u in users.values()]  # good, refused, disabled, locked
    attempts += [(u.name, "Wrong-" + u.password) for u in users.values()]
    attempts += [("*", users["alice"].password), ("x" * 500, users["alice"].password)]
    for name, password in attempts:
        login(a, name, password)
    login(make(directory, server_port=dead_ldap_port), "alice", users["alice"].password)
    login(make(directory, server_port=slow_ldap_server, read_timeout=1), "alice",
          users["alice"].password)
    login(make(directory, lookup_dn_search_password="Wrong-" + directory.bind_password),
          "alice", users["alice"].password)
    assert len(caplog.records) >= len(attempts)
    secrets = [p for _, p in attempts] + [directory.bind_password, "Wrong-" + directory.bind_password]
    for record in caplog.records:
        line = record.getMessage()
        for secret in secrets:
            assert secret not in line, f"password in log: {record.name} {record.levelname}"
