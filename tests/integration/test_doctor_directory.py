"""`gpu-pool doctor` connects to the directory as the hub's login would: the real OpenLDAP on
127.0.0.1 (StartTLS and LDAPS), with a wrong CA, a wrong bind password and a missing group.
Each failure names the step and the GPUHUB_DIRECTORY_* setting to fix; the password never shows."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

from devservices.ldap.tls import make_ca
from spawner.auth import connection
from spawner.auth.messages import DirectoryUnavailable
from spawner.cli import doctor

REPO = Path(__file__).resolve().parents[2]
ME = pwd.getpwuid(os.geteuid()).pw_name
CRYPT_KEY = "ab" * 32


@pytest.fixture
def env_for(openldap, tmp_path):
    """GPUHUB_* settings of a hub logging in against the test OpenLDAP, with changes."""
    data = tmp_path / "data"
    data.mkdir(mode=0o700)

    def make(password: str | None = None, **changes: str) -> dict[str, str]:
        secret = tmp_path / "bind-password"
        secret.write_text((password or openldap.bind_password) + "\n")
        secret.chmod(0o600)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUHUB_", "GPU_POOL_"))}
        env.update(GPUHUB_DATA_DIR=str(data), GPUHUB_INVENTORY="simulated", GPUHUB_CULL="false",
                   JUPYTERHUB_CRYPT_KEY=CRYPT_KEY, **openldap.settings_env(password_file=str(secret)))
        env.update(changes)
        return env

    return make


def check(env: dict[str, str]) -> dict:
    d = doctor.Doctor(doctor.target_from_env(ME, env))
    d.check_directory()
    (result,) = d.results
    assert result.check == "directory"
    return {"status": result.status, "detail": result.detail, "fix": result.fix}


def test_a_directory_set_up_right_passes_every_step(env_for, openldap):
    result = check(env_for())
    assert result["status"] == "ok", result
    assert (f"ldap://{openldap.host}:{openldap.port} (StartTLS), TLS verified with {openldap.ca_file}"
            in result["detail"])
    assert f"bound as {openldap.bind_dn}" in result["detail"]
    assert f"groups found: {openldap.allowed_group}, {openldap.admin_group}" in result["detail"]
    ldaps = check(env_for(GPUHUB_DIRECTORY_TLS="ldaps", GPUHUB_DIRECTORY_PORT=str(openldap.ldaps_port)))
    assert ldaps["status"] == "ok" and ldaps["detail"].startswith(f"ldaps://{openldap.host}:"), ldaps


@pytest.mark.parametrize("tls", ["starttls", "ldaps"])
def test_a_stale_ca_fails_the_tls_handshake_and_names_the_ca_setting(env_for, openldap, tmp_path, tls):
    stale, _ = make_ca(tmp_path / "stale-ca", "stale")
    port = openldap.port if tls == "starttls" else openldap.ldaps_port
    result = check(env_for(GPUHUB_DIRECTORY_CA_FILE=str(stale), GPUHUB_DIRECTORY_TLS=tls,
                           GPUHUB_DIRECTORY_PORT=str(port)))
    assert result["status"] == "FAIL"
    assert result["detail"].startswith("TLS handshake with") and str(stale) in result["detail"], result
    assert "GPUHUB_DIRECTORY_CA_FILE" in result["fix"] and "openssl s_client" in result["fix"]
    assert "tls_ca_file" not in json.dumps(result)


def test_the_hubs_own_login_names_the_ca_setting_too(openldap, tmp_path):
    """The log line of a login that met the stale CA (the 503 the admin saw) names the setting."""
    stale, _ = make_ca(tmp_path / "stale-ca", "stale")
    from ldapauthenticator.ldapauthenticator import TlsStrategy

    endpoint = connection.Endpoint(openldap.host, openldap.port, TlsStrategy.before_bind, str(stale))
    with pytest.raises(DirectoryUnavailable) as caught:
        connection.bind(endpoint, openldap.bind_dn, openldap.bind_password)
    assert "GPUHUB_DIRECTORY_CA_FILE" in str(caught.value) and "tls_ca_file" not in str(caught.value)


def test_a_wrong_bind_password_fails_the_bind_and_is_never_shown(env_for):
    password = "not-the-service-password-7f3a"
    env = env_for(password=password)
    result = check(env)
    assert result["status"] == "FAIL" and "the bind as" in result["detail"] and "refused" in result["detail"]
    assert "GPUHUB_DIRECTORY_BIND_DN" in result["fix"] and "GPUHUB_DIRECTORY_BIND_PASSWORD_FILE" in result["fix"]
    # The whole command, as an admin runs it: the line is there, the password nowhere.
    proc = subprocess.run([sys.executable, "-m", "spawner.cli", "doctor"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert any(line.startswith("FAIL  directory") for line in proc.stdout.splitlines()), proc.stdout
    assert password not in proc.stdout + proc.stderr


def test_a_missing_group_is_named_with_its_setting(env_for, openldap):
    result = check(env_for(GPUHUB_DIRECTORY_ALLOWED_GROUPS="no-such-group"))
    assert result["status"] == "FAIL", result
    assert "'no-such-group' of GPUHUB_DIRECTORY_ALLOWED_GROUPS not found" in result["detail"]
    assert "GPUHUB_DIRECTORY_ALLOWED_GROUPS" in result["fix"]
    admins = check(env_for(GPUHUB_DIRECTORY_ADMIN_GROUPS=f"cn=nobody,{openldap.group_base}"))
    assert admins["status"] == "FAIL" and "GPUHUB_DIRECTORY_ADMIN_GROUPS" in admins["detail"]


def test_a_wrong_user_base_is_named(env_for, openldap):
    result = check(env_for(GPUHUB_DIRECTORY_USER_BASE=f"ou=nobody,{openldap.base_dn}"))
    assert result["status"] == "FAIL" and result["detail"].startswith("GPUHUB_DIRECTORY_USER_BASE="), result


def test_a_directory_nobody_listens_on_fails_the_connection(env_for, dead_ldap_port):
    result = check(env_for(GPUHUB_DIRECTORY_PORT=str(dead_ldap_port)))
    assert result["status"] == "FAIL" and result["detail"].startswith("cannot connect to"), result
    assert "GPUHUB_DIRECTORY_SERVER" in result["fix"] and "GPUHUB_DIRECTORY_PORT" in result["fix"]


def test_the_hubs_login_log_names_the_settings_of_a_refused_service_account(openldap, caplog):
    """The 503 at a first login: the hub's log line says which settings to fix, not which traits."""
    from traitlets.config import Config

    from spawner.auth import DirectoryAuthenticator
    from spawner.auth.messages import LoginRefused

    c = Config()
    for key, value in openldap.authenticator_config(lookup_dn_search_password="not-the-password").items():
        setattr(c.DirectoryAuthenticator, key, value)
    a = DirectoryAuthenticator(config=c)
    user = next(iter(openldap.users.values()))
    with pytest.raises(LoginRefused) as refused, caplog.at_level("ERROR"):
        a._authenticate_blocking(user.name, user.password)
    assert refused.value.status == 503
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "GPUHUB_DIRECTORY_BIND_DN" in logged and "GPUHUB_DIRECTORY_BIND_PASSWORD_FILE" in logged, logged
    assert "lookup_dn_search_password" not in logged and "not-the-password" not in logged
