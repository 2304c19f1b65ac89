"""Logging in through the hub's real login form, against real directories.

A real hub process (tests/fixtures/hub.py) with DirectoryAuthenticator: the
browser's path (GET /hub/login for the _xsrf token, POST the form), then the
REST API for the user's JupyterHub groups, admin flag and auth_state, and a
spawned container's uid:gid.
"""

from __future__ import annotations

import html
import re
import secrets

import pytest
import requests

from devservices.ldap.common import Directory
from spawner import auth

AUTHENTICATOR = "spawner.auth.DirectoryAuthenticator"


def directory_hub(make_hub, directory: Directory):
    return make_hub(
        extra_config=directory.config_py(authenticator_class=AUTHENTICATOR),
        env={
            "GPUHUB_AUTHENTICATOR": "ldap",
            # auth_state (uid/gid for the spawner) is stored encrypted with this key.
            "JUPYTERHUB_CRYPT_KEY": secrets.token_hex(32),
        },
    )


def form_login(hub, username: str, password: str) -> requests.Response:
    """What a browser does: fetch the form (and its _xsrf token), post it."""
    session = requests.Session()
    page = session.get(f"{hub.url}/hub/login", timeout=30)
    assert page.status_code == 200, page.text[:500]
    match = re.search(r'name="_xsrf"\s+value="([^"]+)"', page.text)
    assert match, "login form has no _xsrf field"
    return session.post(
        f"{hub.url}/hub/login",
        data={"username": username, "password": password, "_xsrf": html.unescape(match.group(1))},
        allow_redirects=False,
        timeout=60,
    )


def form_error(response: requests.Response) -> str:
    return html.unescape(response.text)


def user_model(hub, name: str) -> dict:
    r = hub.api("GET", f"/users/{name}")
    assert r.status_code == 200, r.text
    return r.json()


def test_form_login_syncs_groups_admin_and_auth_state(make_hub, directory):
    hub = directory_hub(make_hub, directory)
    for name in ("alice", "carol"):
        user = directory.users[name]
        r = form_login(hub, user.name, user.password)
        assert r.status_code == 302, form_error(r)[:2000]
        model = user_model(hub, user.name)
        expected = sorted(directory.groups_of(user.name))
        assert sorted(model["groups"]) == expected
        assert model["admin"] is (directory.admin_group in expected)
        state = model["auth_state"]
        assert state["uid_number"] == user.uid_number
        assert state["gid_number"] == user.gid_number
        assert sorted(state["groups"]) == expected
        assert state["directory"] == directory.kind
    # The directory's groups are JupyterHub groups now, members and all.
    r = hub.api("GET", f"/groups/{directory.allowed_group}")
    assert r.status_code == 200
    assert {"alice", "carol"} <= set(r.json()["users"])

    # Refusals reach the form as messages, with no stack trace.
    frank = directory.users["frank"]
    refusals = [
        (frank.name, frank.password, auth.MSG_NOT_ALLOWED),
        (frank.name, "Wrong-" + frank.password, "Invalid username or password"),
        ("alice)(uid=*", "x", auth.MSG_BAD_NAME),
        ("alice", "   ", auth.MSG_NO_PASSWORD),
    ]
    refusals += [(u.name, u.password, auth.MSG_ACCOUNT["disabled"])
                 for u in directory.users.values() if u.disabled]
    for username, password, message in refusals:
        r = form_login(hub, username, password)
        assert r.status_code == 403 and message in form_error(r), (username, r.status_code)
        assert "Traceback" not in r.text
    # The hub log never shows a password.
    log = hub.log_path.read_text(errors="replace")
    for user in directory.users.values():
        assert user.password not in log
    assert directory.bind_password not in log


def test_spawned_container_runs_as_directory_uid_gid(make_hub, openldap, docker_client):
    hub = directory_hub(make_hub, openldap)
    alice = openldap.users["alice"]
    assert form_login(hub, alice.name, alice.password).status_code == 302
    hub.start_server(alice.name)
    try:
        containers = [c for c in hub.containers(docker_client) if c.status == "running"]
        assert len(containers) == 1
        exit_code, out = containers[0].exec_run(["id", "-u"])
        assert exit_code == 0 and out.decode().strip() == str(alice.uid_number)
        exit_code, out = containers[0].exec_run(["id", "-g"])
        assert exit_code == 0 and out.decode().strip() == str(alice.gid_number)
    finally:
        hub.stop_server(alice.name)
        hub.wait_stopped(alice.name)


def test_hub_with_plain_ldap_not_allowed_does_not_start(make_hub, openldap):
    hub = make_hub(
        extra_config=openldap.config_py(tls="plain", authenticator_class=AUTHENTICATOR,
                                        allow_plaintext=False),
        env={"GPUHUB_AUTHENTICATOR": "ldap", "JUPYTERHUB_CRYPT_KEY": secrets.token_hex(32)},
        start=False,
    )
    with pytest.raises(RuntimeError, match="the hub exited"):
        hub.start(timeout=60)
    assert "allow_plaintext" in hub.log_path.read_text(errors="replace")


def group_dn(directory: Directory, name: str) -> str:
    """The DN of a directory group, looked up as the hub's service account would."""
    import ssl

    import ldap3

    tls = ldap3.Tls(ca_certs_file=directory.ca_file, validate=ssl.CERT_REQUIRED,
                    valid_names=[directory.tls_server_name] if directory.tls_server_name else None)
    server = ldap3.Server(directory.host, port=directory.port, tls=tls, connect_timeout=5)
    with ldap3.Connection(server, directory.bind_dn, directory.bind_password,
                          auto_bind=ldap3.AUTO_BIND_TLS_BEFORE_BIND) as conn:
        conn.search(directory.group_base, f"(cn={ldap3.utils.conv.escape_filter_chars(name)})", attributes=[])
        assert conn.entries, f"no group {name} under {directory.group_base}"
        return conn.entries[0].entry_dn


def test_group_dns_in_the_settings_let_members_in(make_hub, directory):
    # GPUHUB_DIRECTORY_*_GROUPS as DNs: their commas must not split them.
    allowed = group_dn(directory, directory.allowed_group)
    admins = group_dn(directory, directory.admin_group)
    hub = make_hub(env={
        **directory.settings_env(allowed_groups=f"{allowed}; cn=nobody-is-here,{directory.group_base}",
                                 admin_groups=admins),
        "JUPYTERHUB_CRYPT_KEY": secrets.token_hex(32),
    })
    for name in ("alice", "carol"):
        user = directory.users[name]
        r = form_login(hub, user.name, user.password)
        assert r.status_code == 302, form_error(r)[:2000]
        assert user_model(hub, user.name)["admin"] is (directory.admin_group in directory.groups_of(name))
    frank = directory.users["frank"]
    r = form_login(hub, frank.name, frank.password)
    assert r.status_code == 403 and auth.MSG_NOT_ALLOWED in form_error(r)
