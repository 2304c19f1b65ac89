"""GPUHUB_* settings: defaults, and errors that name the setting."""

import json

import pytest
from traitlets.config import Config

from spawner.settings import SettingsError, apply_settings, load_settings


def test_defaults_listen_on_loopback_with_nvml_and_directory_login():
    s = load_settings({})
    assert s.bind_url == "http://127.0.0.1:8000"
    assert s.inventory == "nvml" and s.authenticator == "ldap"
    assert s.pool_db_url.startswith("sqlite:///") and s.pool_db_url.endswith("gpu-pool.sqlite")
    assert s.max_gpus_per_user is None


@pytest.mark.parametrize("env, setting", [
    ({"GPUHUB_INVENTORY": "magic"}, "GPUHUB_INVENTORY"),
    ({"GPUHUB_SIMULATED_GPUS": "four"}, "GPUHUB_SIMULATED_GPUS"),
    ({"GPUHUB_SIMULATED_GPUS": "-1"}, "GPUHUB_SIMULATED_GPUS"),
    ({"GPUHUB_BIND_URL": "127.0.0.1:8000"}, "GPUHUB_BIND_URL"),
    ({"GPUHUB_AUTHENTICATOR": "dummy"}, "GPUHUB_DUMMY_PASSWORD"),
    ({"GPUHUB_CLEANUP_SERVERS": "maybe"}, "GPUHUB_CLEANUP_SERVERS"),
    ({"GPUHUB_HUB_PORT": "8000"}, "GPUHUB_HUB_PORT"),
    ({"GPUHUB_PROFILES_FILE": "/nonexistent/profiles.json"}, "GPUHUB_PROFILES_FILE"),
    ({"GPUHUB_GPU_IDLE_PERCENT": "150"}, "GPUHUB_GPU_IDLE_PERCENT"),
    ({"GPUHUB_LEASE_WAIT_TIMEOUT": "-5"}, "GPUHUB_LEASE_WAIT_TIMEOUT"),
])
def test_bad_settings_stop_the_hub_with_the_settings_name(env, setting):
    with pytest.raises(SettingsError) as err:
        load_settings(env)
    assert setting in str(err.value)


def test_profiles_file_replaces_the_default_profiles(tmp_path):
    f = tmp_path / "profiles.json"
    f.write_text('[{"slug": "only", "display_name": "Only", "image": "img"}]')
    assert load_settings({"GPUHUB_PROFILES_FILE": str(f)}).profiles[0]["slug"] == "only"


# ------------------------------------------------------------ directory login

CRYPT_KEY = "0" * 64  # 32 bytes in hex; a test value, not a secret


def directory_env(**overrides) -> dict:
    """A complete GPUHUB_DIRECTORY_* setting for OpenLDAP, changed by `overrides`."""
    env = {
        "GPUHUB_DIRECTORY": "openldap",
        "GPUHUB_DIRECTORY_SERVER": "ldap.example.com",
        "GPUHUB_DIRECTORY_BIND_DN": "cn=hub,ou=services,dc=example,dc=com",
        "GPUHUB_DIRECTORY_BIND_PASSWORD": "Bind-Secret-1",
        "GPUHUB_DIRECTORY_USER_BASE": "ou=people,dc=example,dc=com",
        "GPUHUB_DIRECTORY_GROUP_BASE": "ou=groups,dc=example,dc=com",
        "GPUHUB_DIRECTORY_ALLOWED_GROUPS": "gpu-users, ml-team",
        "GPUHUB_DIRECTORY_ADMIN_GROUPS": "hub-admins",
        "JUPYTERHUB_CRYPT_KEY": CRYPT_KEY,
    }
    env.update(overrides)
    return {k: v for k, v in env.items() if v is not None}


def authenticator_traits(env: dict) -> dict:
    """The traits of a real DirectoryAuthenticator made from these settings
    (its own checks run in __init__, so a setting it refuses fails here)."""
    from traitlets.config import Config

    from spawner.auth import DirectoryAuthenticator
    from spawner.settings import configure_directory

    c = Config()
    configure_directory(c, load_settings(env).directory)
    auth = DirectoryAuthenticator(config=c)
    return {name: getattr(auth, name) for name in c.DirectoryAuthenticator}


def test_openldap_defaults_to_verified_starttls_on_389():
    traits = authenticator_traits(directory_env(GPUHUB_DIRECTORY_CA_FILE=__file__))
    assert traits["directory"] == "openldap"
    assert traits["server_address"] == "ldap.example.com"
    assert (str(traits["tls_strategy"].name), traits["server_port"]) == ("before_bind", 389)
    assert traits["allow_plaintext"] is False
    assert traits["tls_ca_file"] == __file__
    assert traits["allowed_groups"] == ["gpu-users", "ml-team"]
    assert traits["admin_groups"] == ["hub-admins"]
    assert traits["group_search_base"] == "ou=groups,dc=example,dc=com"
    assert traits["lookup_dn_search_user"] == "cn=hub,ou=services,dc=example,dc=com"
    assert traits["lookup_dn_search_password"] == "Bind-Secret-1"


GPU_DN = "cn=gpu,ou=groups,dc=example,dc=com"
ML_DN = "CN=ML Team,OU=Groups,DC=example,DC=com"


@pytest.mark.parametrize("raw, expected", [
    (GPU_DN, [GPU_DN]),
    (f"{GPU_DN}; {ML_DN}", [GPU_DN, ML_DN]),
    (f"{GPU_DN}\n{ML_DN}\n", [GPU_DN, ML_DN]),
    (json.dumps([GPU_DN, "plain-name"]), [GPU_DN, "plain-name"]),
    ("gpu-users,ml-team", ["gpu-users", "ml-team"]),
])
def test_group_settings_keep_a_dn_whole(raw, expected):
    # A DN has commas of its own: split on them and nobody matches.
    traits = authenticator_traits(directory_env(GPUHUB_DIRECTORY_CA_FILE=__file__,
                                                GPUHUB_DIRECTORY_ALLOWED_GROUPS=raw,
                                                GPUHUB_DIRECTORY_ADMIN_GROUPS=raw))
    assert traits["allowed_groups"] == expected
    assert traits["admin_groups"] == expected


def test_group_setting_that_is_broken_json_names_the_variable():
    with pytest.raises(SettingsError, match="GPUHUB_DIRECTORY_ALLOWED_GROUPS"):
        load_settings(directory_env(GPUHUB_DIRECTORY_ALLOWED_GROUPS='["cn=gpu,dc=x"'))


def test_active_directory_defaults_to_ldaps_on_636_and_groups_under_the_user_base():
    traits = authenticator_traits(directory_env(
        GPUHUB_DIRECTORY="active_directory", GPUHUB_DIRECTORY_GROUP_BASE=None,
        GPUHUB_DIRECTORY_TLS_SERVER_NAME="dc1.corp.example.com"))
    assert (str(traits["tls_strategy"].name), traits["server_port"]) == ("on_connect", 636)
    assert traits["group_search_base"] == traits["user_search_base"]
    assert traits["tls_kwargs"] == {"valid_names": ["dc1.corp.example.com"]}


def test_plain_ldap_only_with_the_explicit_allow_flag():
    traits = authenticator_traits(directory_env(
        GPUHUB_DIRECTORY_TLS="plain", GPUHUB_DIRECTORY_ALLOW_PLAINTEXT="true"))
    assert (str(traits["tls_strategy"].name), traits["allow_plaintext"]) == ("insecure", True)
    with pytest.raises(SettingsError, match="GPUHUB_DIRECTORY_ALLOW_PLAINTEXT"):
        load_settings(directory_env(GPUHUB_DIRECTORY_TLS="plain"))


def test_bind_password_from_a_file_without_its_trailing_newline(tmp_path):
    secret = tmp_path / "bind-password"
    secret.write_text("From-A-File 2\n")
    s = load_settings(directory_env(GPUHUB_DIRECTORY_BIND_PASSWORD=None,
                                    GPUHUB_DIRECTORY_BIND_PASSWORD_FILE=str(secret)))
    assert s.directory.bind_password == "From-A-File 2"


def test_the_bind_password_never_shows_in_the_settings_or_their_errors(tmp_path):
    s = load_settings(directory_env())
    assert "Bind-Secret-1" not in repr(s) and "Bind-Secret-1" not in str(s)
    for env in (directory_env(GPUHUB_DIRECTORY_BIND_DN=None),
                directory_env(GPUHUB_DIRECTORY_BIND_PASSWORD_FILE=str(tmp_path / "x"))):
        with pytest.raises(SettingsError) as err:
            load_settings(env)
        assert "Bind-Secret-1" not in str(err.value)


def test_no_gpuhub_directory_leaves_the_directory_to_a_config_file():
    # hub_config/examples/*.py set c.DirectoryAuthenticator themselves.
    assert load_settings({"GPUHUB_AUTHENTICATOR": "ldap"}).directory is None


@pytest.mark.parametrize("overrides, named", [
    ({"GPUHUB_DIRECTORY": "novell"}, "GPUHUB_DIRECTORY"),
    ({"GPUHUB_DIRECTORY_SERVER": None}, "GPUHUB_DIRECTORY_SERVER"),
    ({"GPUHUB_DIRECTORY_SERVER": "ldaps://ldap.example.com:636"}, "GPUHUB_DIRECTORY_SERVER"),
    ({"GPUHUB_DIRECTORY_PORT": "ldap"}, "GPUHUB_DIRECTORY_PORT"),
    ({"GPUHUB_DIRECTORY_PORT": "70000"}, "GPUHUB_DIRECTORY_PORT"),
    ({"GPUHUB_DIRECTORY_TLS": "ssl"}, "GPUHUB_DIRECTORY_TLS"),
    ({"GPUHUB_DIRECTORY_TLS": "plain"}, "GPUHUB_DIRECTORY_TLS"),
    ({"GPUHUB_DIRECTORY_ALLOW_PLAINTEXT": "true"}, "GPUHUB_DIRECTORY_ALLOW_PLAINTEXT"),
    ({"GPUHUB_DIRECTORY_TLS": "plain", "GPUHUB_DIRECTORY_ALLOW_PLAINTEXT": "yes",
      "GPUHUB_DIRECTORY_CA_FILE": __file__}, "GPUHUB_DIRECTORY_CA_FILE"),
    ({"GPUHUB_DIRECTORY_CA_FILE": "/nonexistent/ca.pem"}, "GPUHUB_DIRECTORY_CA_FILE"),
    ({"GPUHUB_DIRECTORY_BIND_PASSWORD": None}, "GPUHUB_DIRECTORY_BIND_PASSWORD"),
    ({"GPUHUB_DIRECTORY_BIND_DN": None}, "GPUHUB_DIRECTORY_BIND_DN"),
    ({"GPUHUB_DIRECTORY_BIND_PASSWORD_FILE": "/nonexistent/pw"}, "GPUHUB_DIRECTORY_BIND_PASSWORD_FILE"),
    ({"GPUHUB_DIRECTORY": "active_directory", "GPUHUB_DIRECTORY_BIND_DN": None,
      "GPUHUB_DIRECTORY_BIND_PASSWORD": None}, "GPUHUB_DIRECTORY_BIND_DN"),
    ({"GPUHUB_DIRECTORY_USER_BASE": None}, "GPUHUB_DIRECTORY_USER_BASE"),
    ({"GPUHUB_DIRECTORY_ALLOWED_GROUPS": " , "}, "GPUHUB_DIRECTORY_ALLOWED_GROUPS"),
    ({"JUPYTERHUB_CRYPT_KEY": None}, "JUPYTERHUB_CRYPT_KEY"),
    ({"JUPYTERHUB_CRYPT_KEY": "too-short"}, "JUPYTERHUB_CRYPT_KEY"),
    ({"GPUHUB_DIRECTORY": None}, "GPUHUB_DIRECTORY"),  # the others set without it
    ({"GPUHUB_AUTHENTICATOR": "dummy", "GPUHUB_DUMMY_PASSWORD": "x"}, "GPUHUB_DIRECTORY"),
])
def test_missing_or_contradictory_directory_settings_name_the_variable(overrides, named):
    with pytest.raises(SettingsError) as err:
        load_settings(directory_env(**overrides))
    assert named in str(err.value)


def test_both_password_variables_are_a_contradiction(tmp_path):
    secret = tmp_path / "pw"
    secret.write_text("x")
    with pytest.raises(SettingsError, match="GPUHUB_DIRECTORY_BIND_PASSWORD_FILE"):
        load_settings(directory_env(GPUHUB_DIRECTORY_BIND_PASSWORD_FILE=str(secret)))


def test_crypt_key_may_be_base64_or_several_keys_while_rotating():
    import base64

    b64 = base64.urlsafe_b64encode(bytes(range(32))).decode()
    assert load_settings(directory_env(JUPYTERHUB_CRYPT_KEY=f"{b64};{CRYPT_KEY}")).directory


def read_env_file(path) -> dict[str, str]:
    env = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            env[key] = value
    return env


def test_the_production_example_is_complete_and_names_only_real_settings(tmp_path):
    from pathlib import Path

    example = Path(__file__).resolve().parents[2] / "hub_config" / "examples" / "production.env"
    env = read_env_file(example)
    package = Path(__file__).resolve().parents[2] / "spawner" / "settings"
    source = "".join(p.read_text() for p in sorted(package.glob("*.py")))
    source += (package.parent / "pool" / "__init__.py").read_text()  # the ledger's URL (ENV_DB_URL)
    commented = {line.lstrip("#").partition("=")[0] for line in example.read_text().splitlines()
                 if line.startswith("#GPUHUB_")}
    for name in set(env) | commented:
        assert name == "JUPYTERHUB_CRYPT_KEY" or f'"{name}"' in source, f"{name} is not a setting"
    # With its files present and a real key, it is a valid configuration.
    (tmp_path / "ca.pem").write_text("x")
    (tmp_path / "pw").write_text("Service-Secret\n")
    env.update(GPUHUB_DIRECTORY_CA_FILE=str(tmp_path / "ca.pem"),
               GPUHUB_DIRECTORY_BIND_PASSWORD_FILE=str(tmp_path / "pw"),
               GPUHUB_DATA_DIR=str(tmp_path), JUPYTERHUB_CRYPT_KEY=CRYPT_KEY)
    s = load_settings(env)
    assert s.directory.kind == "active_directory" and s.directory.bind_password == "Service-Secret"
    assert s.cleanup_servers is False
    # ...and the placeholder key is refused, naming the variable.
    with pytest.raises(SettingsError, match="JUPYTERHUB_CRYPT_KEY"):
        load_settings({**env, "JUPYTERHUB_CRYPT_KEY": read_env_file(example)["JUPYTERHUB_CRYPT_KEY"]})


# -- HTTPS: GPUHUB_SSL_CERT / GPUHUB_SSL_KEY ----------------------------------

@pytest.fixture
def tls_files(tmp_path):
    cert, key = tmp_path / "hub.pem", tmp_path / "hub.key"
    cert.write_text("certificate\n")
    key.write_text("key\n")
    return str(cert), str(key)


def test_ssl_cert_and_key_become_jupyterhubs_own_tls(tls_files, tmp_path):
    from traitlets.config import Config

    from spawner.settings.apply import apply_settings

    cert, key = tls_files
    s = load_settings({"GPUHUB_SSL_CERT": cert, "GPUHUB_SSL_KEY": key,
                       "GPUHUB_BIND_URL": "https://127.0.0.1:8443", "GPUHUB_DATA_DIR": str(tmp_path)})
    assert (s.ssl_cert, s.ssl_key) == (cert, key)
    c = Config()
    apply_settings(c, s)
    assert (c.JupyterHub.ssl_cert, c.JupyterHub.ssl_key) == (cert, key)
    assert c.JupyterHub.bind_url == "https://127.0.0.1:8443"


def test_without_ssl_settings_the_hub_sets_no_tls(tmp_path):
    from traitlets.config import Config

    from spawner.settings.apply import apply_settings

    c = Config()
    apply_settings(c, load_settings({"GPUHUB_DATA_DIR": str(tmp_path)}))
    assert "ssl_cert" not in c.JupyterHub and "ssl_key" not in c.JupyterHub


@pytest.mark.parametrize("which, setting, words", [
    ("cert only", "GPUHUB_SSL_KEY", "is not"),
    ("key only", "GPUHUB_SSL_CERT", "is not"),
    ("http with both", "GPUHUB_BIND_URL", "https://"),
    ("https with neither", "GPUHUB_BIND_URL", "GPUHUB_SSL_CERT"),
    ("missing cert", "GPUHUB_SSL_CERT", "cannot be read"),
    ("key is a directory", "GPUHUB_SSL_KEY", "cannot be read"),
])
def test_bad_https_settings_name_the_setting(tls_files, tmp_path, which, setting, words):
    cert, key = tls_files
    env = {
        "cert only": {"GPUHUB_SSL_CERT": cert, "GPUHUB_BIND_URL": "https://127.0.0.1:8443"},
        "key only": {"GPUHUB_SSL_KEY": key, "GPUHUB_BIND_URL": "https://127.0.0.1:8443"},
        "http with both": {"GPUHUB_SSL_CERT": cert, "GPUHUB_SSL_KEY": key},
        "https with neither": {"GPUHUB_BIND_URL": "https://127.0.0.1:8443"},
        "missing cert": {"GPUHUB_SSL_CERT": str(tmp_path / "nope.pem"), "GPUHUB_SSL_KEY": key,
                         "GPUHUB_BIND_URL": "https://127.0.0.1:8443"},
        "key is a directory": {"GPUHUB_SSL_CERT": cert, "GPUHUB_SSL_KEY": str(tmp_path),
                               "GPUHUB_BIND_URL": "https://127.0.0.1:8443"},
    }[which]
    with pytest.raises(SettingsError) as err:
        load_settings(env)
    assert setting in str(err.value) and words in str(err.value)


def test_loading_the_config_outside_a_hub_only_sets_values(tmp_path):
    # gpu-pool --config and gpu-pool doctor read the hub's config: they must not make its data
    # directory, a Docker network or the reconciler's task (the doctor used to undo the first).
    from spawner.engines.common import reconciler

    data = tmp_path / "not-yet"
    c = Config()
    apply_settings(c, load_settings({"GPUHUB_DATA_DIR": str(data)}))
    assert c.JupyterHub.cookie_secret_file == str(data / "jupyterhub_cookie_secret")
    assert not data.exists()
    assert reconciler._hub_task is None
