"""Secrets as files (Docker secrets under /run/secrets/): GPUHUB_POOL_DB_URL_FILE,
JUPYTERHUB_CRYPT_KEY_FILE, GPUHUB_COOKIE_SECRET_FILE, and the commands beside the hub."""

from __future__ import annotations

import pytest
from traitlets.config import Config

from spawner.settings import SettingsError, apply_settings, load_settings
from spawner.settings.hub import ledger_url

PG_URL = "postgresql+psycopg://gpuhub:S3cret-pw@db.lab/gpupool"
KEY = "a" * 64  # 32 bytes of hex


def secret(tmp_path, name: str, value: str, mode: int = 0o400):
    path = tmp_path / name
    path.write_text(value)
    path.chmod(mode)
    return str(path)


def swarm_env(tmp_path, **extra) -> dict:
    return {"GPUHUB_SPAWNER": "swarm", "GPUHUB_HUB_CONNECT_IP": "gpuhub-hub", "GPUHUB_DATA_DIR": str(tmp_path),
            "GPUHUB_AUTHENTICATOR": "dummy", "GPUHUB_DUMMY_PASSWORD": "x", **extra}


def test_the_ledger_url_from_a_secret_file_reaches_the_hub_and_its_services(tmp_path):
    env = swarm_env(tmp_path, GPUHUB_POOL_DB_URL_FILE=secret(tmp_path, "db", PG_URL + "\n"))
    s = load_settings(env)
    assert s.pool_db_url == PG_URL  # the trailing newline of `echo ... > file` is not part of it
    c = Config()
    apply_settings(c, s)
    assert c.GPUPool.db_url == PG_URL
    # the processes beside the hub get it from the hub (their environment), not from the file
    given = [svc["environment"]["GPUHUB_POOL_DB_URL"] for svc in c.JupyterHub.services
             if "GPUHUB_POOL_DB_URL" in svc.get("environment", {})]
    assert given and set(given) == {PG_URL}  # the idle culler, the gpu-pool service
    assert ledger_url(env) == PG_URL  # the rule `gpu-pool` uses too


def test_without_the_file_swarm_still_asks_for_postgresql(tmp_path):
    with pytest.raises(SettingsError, match="PostgreSQL"):
        load_settings(swarm_env(tmp_path))


@pytest.mark.parametrize("name", ["GPUHUB_POOL_DB_URL", "JUPYTERHUB_CRYPT_KEY"])
def test_a_secret_both_inline_and_as_a_file_is_refused(tmp_path, name):
    value = PG_URL if name == "GPUHUB_POOL_DB_URL" else KEY
    env = {**swarm_env(tmp_path, GPUHUB_POOL_DB_URL=PG_URL), name: value, f"{name}_FILE": secret(tmp_path, "s", value)}
    with pytest.raises(SettingsError, match=f"{name} and {name}_FILE are both set"):
        load_settings(env)


@pytest.mark.parametrize("content, problem", [(None, "cannot be read"), ("\n", "is empty")])
def test_an_unreadable_or_empty_secret_file_names_the_variable_never_the_value(tmp_path, content, problem):
    path = str(tmp_path / "missing") if content is None else secret(tmp_path, "empty", content)
    with pytest.raises(SettingsError) as err:
        load_settings(swarm_env(tmp_path, GPUHUB_POOL_DB_URL_FILE=path))
    assert "GPUHUB_POOL_DB_URL_FILE" in str(err.value) and problem in str(err.value)


def test_the_crypt_key_from_a_file_becomes_the_crypt_keepers_keys_unshown(tmp_path):
    other = "b" * 64
    env = swarm_env(tmp_path, GPUHUB_POOL_DB_URL=PG_URL,
                    JUPYTERHUB_CRYPT_KEY_FILE=secret(tmp_path, "key", f"{KEY};{other}\n"))
    s = load_settings(env)
    assert KEY not in repr(s)
    c = Config()
    apply_settings(c, s)
    # (["keys"]: a Config section's .keys is the dict method) JupyterHub reads only JUPYTERHUB_CRYPT_KEY itself
    assert c.CryptKeeper["keys"] == [KEY, other]
    # a key that is no key is refused as the inline one is, without echoing it
    bad = swarm_env(tmp_path, GPUHUB_POOL_DB_URL=PG_URL, JUPYTERHUB_CRYPT_KEY_FILE=secret(tmp_path, "bad", "0123"))
    with pytest.raises(SettingsError, match="JUPYTERHUB_CRYPT_KEY: key 1") as err:
        load_settings(bad)
    assert "0123" not in str(err.value)


def test_an_inline_crypt_key_is_left_to_jupyterhub(tmp_path):
    c = Config()
    apply_settings(c, load_settings(swarm_env(tmp_path, GPUHUB_POOL_DB_URL=PG_URL, JUPYTERHUB_CRYPT_KEY=KEY)))
    assert "keys" not in c.CryptKeeper


def test_the_cookie_secret_file_is_used_only_when_nobody_else_may_read_it(tmp_path):
    env = swarm_env(tmp_path, GPUHUB_POOL_DB_URL=PG_URL, GPUHUB_COOKIE_SECRET_FILE=secret(tmp_path, "cookie", KEY))
    c = Config()
    apply_settings(c, load_settings(env))
    assert c.JupyterHub.cookie_secret_file == str(tmp_path / "cookie")
    # without it, the hub keeps its own in the data directory
    c = Config()
    apply_settings(c, load_settings(swarm_env(tmp_path, GPUHUB_POOL_DB_URL=PG_URL)))
    assert c.JupyterHub.cookie_secret_file == str(tmp_path / "jupyterhub_cookie_secret")
    # a world-readable one (a Docker secret's default mode, 0444) is refused with the fix
    env["GPUHUB_COOKIE_SECRET_FILE"] = secret(tmp_path, "open", KEY, mode=0o444)
    with pytest.raises(SettingsError, match=r"can be read by anybody \(mode 0444\).*mode: 0400"):
        load_settings(env)


def test_gpu_pool_commands_find_the_ledger_through_the_secret_file(tmp_path, monkeypatch, capsys):
    from spawner.cli.main import main
    from spawner.pool import GPUPool

    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    monkeypatch.delenv("GPUHUB_POOL_DB_URL", raising=False)
    monkeypatch.setenv("GPUHUB_POOL_DB_URL_FILE", secret(tmp_path, "db", url + "\n"))
    # before the hub made the ledger, the command says where it looked, and why there
    assert main(["status"]) != 0
    assert f"No GPU ledger at {tmp_path / 'ledger.sqlite'} (GPUHUB_POOL_DB_URL_FILE)" in capsys.readouterr().err
    pool = GPUPool(db_url=url)
    pool.gpus()  # the ledger's tables, as the hub's first start makes them
    pool.close()
    assert main(["status"]) == 0
    # an unreadable file is a one-line error naming the variable, not a traceback
    monkeypatch.setenv("GPUHUB_POOL_DB_URL_FILE", str(tmp_path / "missing"))
    assert main(["status"]) == 2
    assert "gpu-pool: GPUHUB_POOL_DB_URL_FILE=" in capsys.readouterr().err
