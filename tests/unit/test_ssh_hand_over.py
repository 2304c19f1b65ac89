"""What the hub hands the gpu-ssh service: no directory password in the file, the roles that
reach servers; and the login checks a key or token login goes through (blocked users, allowed
users) with JupyterHub's own authenticator."""

from __future__ import annotations

import asyncio
import json

import pytest
from jupyterhub.app import JupyterHub
from traitlets.config import Config

from spawner.settings import apply_settings, load_settings
from spawner.ssh.gateway_settings import INLINE_SECRET_ENV, read_secrets, render_hand_over
from spawner.ssh.key_store import KeyStore
from spawner.ssh.logins import MSG_BLOCKED, Logins, load_authenticator
from spawner.ssh.server_access import reaches_own_server, rules_from_roles

from .test_settings import directory_env

SECRET = "Bind-Secret-1"


def _hub(env: dict, extra=None):
    settings = load_settings(env)
    c = Config()
    apply_settings(c, settings)
    if extra:
        extra(c)
    return JupyterHub(config=c), settings, c


def _ssh_env(tmp_path, **overrides) -> dict:
    env = directory_env(GPUHUB_AUTHENTICATOR="ldap", GPUHUB_DATA_DIR=str(tmp_path), GPUHUB_SSH="true",
                        **overrides)
    return env


def test_the_hand_over_names_the_password_file_never_the_password(tmp_path):
    secret_file = tmp_path / "bind-password"
    secret_file.write_text(SECRET + "\n")
    secret_file.chmod(0o600)
    hub, settings, c = _hub(_ssh_env(tmp_path, GPUHUB_DIRECTORY_BIND_PASSWORD=None,
                                     GPUHUB_DIRECTORY_BIND_PASSWORD_FILE=str(secret_file)))
    text = render_hand_over(hub, tmp_path / "ssh", settings.directory)
    assert SECRET not in text
    handed = json.loads(text)
    assert handed["authenticator_secrets"] == {
        "DirectoryAuthenticator.lookup_dn_search_password": {"file": str(secret_file.resolve())}}
    # The service reads it from there, and its authenticator has it.
    secrets = read_secrets(handed["authenticator_secrets"], environ={})
    a = load_authenticator(handed["authenticator_class"], handed["authenticator_config"], secrets)
    assert a.lookup_dn_search_password == SECRET
    (service,) = [s for s in c.JupyterHub.services if s["name"] == "gpu-ssh"]
    assert SECRET not in json.dumps(service)


def test_an_inline_password_reaches_the_service_in_its_environment_only(tmp_path):
    hub, settings, c = _hub(_ssh_env(tmp_path))
    text = render_hand_over(hub, tmp_path / "ssh", settings.directory)
    assert SECRET not in text
    handed = json.loads(text)
    (service,) = [s for s in c.JupyterHub.services if s["name"] == "gpu-ssh"]
    assert service["environment"][INLINE_SECRET_ENV] == SECRET
    secrets = read_secrets(handed["authenticator_secrets"], environ=service["environment"])
    assert secrets == {"DirectoryAuthenticator": {"lookup_dn_search_password": SECRET}}


def test_a_password_set_in_a_config_file_goes_to_a_private_file_of_its_own(tmp_path):
    def set_it(c):
        c.DirectoryAuthenticator.lookup_dn_search_password = "From-A-Config-File"
    hub, settings, _ = _hub(_ssh_env(tmp_path), set_it)
    (tmp_path / "ssh").mkdir(exist_ok=True)
    text = render_hand_over(hub, tmp_path / "ssh", settings.directory)
    assert "From-A-Config-File" not in text
    (source,) = json.loads(text)["authenticator_secrets"].values()
    path = tmp_path / "ssh" / "directory-bind-password.DirectoryAuthenticator"
    assert source == {"file": str(path)}
    assert path.read_text() == "From-A-Config-File" and (path.stat().st_mode & 0o077) == 0


def _user(name, roles=("user",), groups=()):
    return {"name": name, "roles": list(roles), "groups": list(groups)}


def test_server_access_follows_the_hubs_roles():
    rules = rules_from_roles([])
    assert reaches_own_server(rules, _user("alice"))  # the default user role: self
    assert reaches_own_server(rules, _user("carol", roles=("admin",)))
    # A blocked user (JupyterHub strips their roles at start) or one without a role reaching servers.
    assert not reaches_own_server(rules, _user("alice", roles=()))
    rules = rules_from_roles([
        {"name": "user", "scopes": ["read:users!user", "access:services"]},
        {"name": "ssh", "scopes": ["access:servers!user"], "users": ["bob"]},
        {"name": "team", "scopes": ["access:servers!group=ml"], "groups": ["ml"]},
        {"name": "just-dana", "scopes": ["access:servers!user=dana"]},
        {"name": "shares", "scopes": ["shares"]},
    ])
    assert not reaches_own_server(rules, _user("alice"))  # the user role no longer holds self
    assert reaches_own_server(rules, _user("bob", roles=("user", "ssh")))
    assert reaches_own_server(rules, _user("erin", groups=("ml",)))  # the group's role, for a member
    assert reaches_own_server(rules, _user("dana", roles=("just-dana",)))
    assert not reaches_own_server(rules, _user("frank", roles=("just-dana",)))
    assert reaches_own_server(rules, _user("gus", roles=("shares",)))  # shares holds access:servers
    assert not reaches_own_server(rules, _user("hal", roles=("unknown-role",)))


def _logins(tmp_path, authenticator) -> Logins:
    from spawner.ssh.hub_client import HubClient
    hub = HubClient(url="http://127.0.0.1:9/hub/api", token="unused", timeout=2)
    return Logins(authenticator, hub, KeyStore(tmp_path, 5, 4096, 2048), 2, rules_from_roles([]))


@pytest.mark.parametrize("allowed", [{"allow_all": True}, {"allowed_users": {"alice"}}])
def test_a_key_or_token_login_of_a_blocked_user_is_refused_before_the_hub_is_asked(tmp_path, allowed):
    # The hub's address answers nothing: a verdict that needs it would say the hub is down.
    from jupyterhub.authenticators.shared import SharedPasswordAuthenticator
    a = SharedPasswordAuthenticator(user_password="x" * 12, blocked_users={"alice"}, **allowed)
    verdict = asyncio.run(_logins(tmp_path, a)._fresh_standing("alice"))
    assert (verdict.ok, verdict.message) == (False, MSG_BLOCKED)


def test_a_key_or_token_login_outside_the_allowed_users_is_refused(tmp_path):
    from jupyterhub.authenticators.shared import SharedPasswordAuthenticator
    a = SharedPasswordAuthenticator(user_password="x" * 12, allowed_users={"alice"}, allow_existing_users=False)
    verdict = asyncio.run(_logins(tmp_path, a)._fresh_standing("mallory"))
    assert not verdict.ok and "not among those allowed" in verdict.message
