"""The SSH gateway's parts that need no service: the guessing throttle, registered keys,
per-server keys, login names, and the hub config GPUHUB_SSH adds."""

from __future__ import annotations

import json
import stat

import asyncssh
import pytest
from traitlets.config import Config

from spawner.settings import SettingsError, apply_settings, load_settings
from spawner.ssh.gateway_settings import SSHGateway
from spawner.ssh.key_store import KeyRefused, KeyStore, parse_key
from spawner.ssh.logins import may_reach_server
from spawner.ssh.server_keys import Endpoint, ServerKeys, login_name
from spawner.ssh.throttle import FailureThrottle


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_throttle_delays_grow_with_failures_up_to_the_cap_and_fade():
    clock = Clock()
    t = FailureThrottle(free=3, delay=0.5, max_delay=4.0, window=60.0, capacity=100, clock=clock)
    waits = []
    for _ in range(10):
        waits.append(t.wait_for("source:a", "account:alice"))
        t.failed("source:a", "account:alice")
    assert waits[:3] == [0, 0, 0]
    assert waits[3:7] == [0.5, 1.0, 2.0, 4.0]
    assert max(waits) == 4.0
    # Another address for the same account is slowed too (the account remembers).
    assert t.wait_for("source:b", "account:alice") == 4.0
    # An unrelated address and account are not.
    assert t.wait_for("source:c", "account:bob") == 0
    # Failures fade: after enough quiet time, attempts are free again.
    clock.now += 60.0 * 10
    assert t.wait_for("source:a", "account:alice") == 0


def test_throttle_memory_is_bounded_under_a_spray():
    t = FailureThrottle(free=0, delay=1, max_delay=1, window=60, capacity=50, clock=Clock())
    for i in range(1000):
        t.failed(f"source:{i}")
    assert len(t) == 50
    assert t.wait_for("source:999") == 1 and t.wait_for("source:0") == 0


def _pub(algorithm="ssh-ed25519", **kw) -> str:
    return asyncssh.generate_private_key(algorithm, comment="me@laptop", **kw).export_public_key().decode()


def test_key_store_bounds_and_refusals(tmp_path):
    store = KeyStore(tmp_path, max_keys=2, max_bytes=4096, min_rsa_bits=2048)
    first = store.add("alice", _pub())
    assert first.comment == "me@laptop" and first.fingerprint.startswith("SHA256:")
    with pytest.raises(KeyRefused, match="registered already"):
        store.add("alice", store.keys("alice")[0].line)
    with pytest.raises(KeyRefused, match="registered already"):
        store.add("bob", store.keys("alice")[0].line)
    store.add("alice", _pub())
    with pytest.raises(KeyRefused, match="max_keys_per_user = 2"):
        store.add("alice", _pub())
    with pytest.raises(KeyRefused, match="1024 bits"):
        store.add("bob", _pub("ssh-rsa", key_size=1024))
    with pytest.raises(KeyRefused, match="private key"):
        store.add("bob", asyncssh.generate_private_key("ssh-ed25519").export_private_key().decode())
    with pytest.raises(KeyRefused, match="not an OpenSSH public key"):
        store.add("bob", "ssh-ed25519 not-base64")
    with pytest.raises(KeyRefused, match="max_key_bytes"):
        parse_key("ssh-ed25519 " + "A" * 5000, 4096, 2048)
    assert store.keys("bob") == []
    key = asyncssh.import_public_key(first.line)
    assert store.accepts("alice", key) and not store.accepts("bob", key)
    assert store.remove("alice", first.fingerprint) and not store.accepts("alice", key)
    assert stat.S_IMODE((tmp_path / "keys" / "alice.json").stat().st_mode) == 0o600


def test_a_key_registered_already_answers_the_same_409_whoever_holds_it(tmp_path):
    # A public key is public: the answer must not tell bob that (or whether) alice uses it.
    store = KeyStore(tmp_path, max_keys=5, max_bytes=4096, min_rsa_bits=2048)
    line = store.add("alice", _pub()).line
    answers = []
    for who in ("alice", "bob"):
        with pytest.raises(KeyRefused) as refused:
            store.add(who, line)
        answers.append((refused.value.status, str(refused.value)))
    assert answers[0] == answers[1]
    status, message = answers[1]
    assert status == 409 and "alice" not in message and "someone else" not in message
    assert store.keys("bob") == []


def test_server_keys_are_made_once_private_and_handed_over(tmp_path):
    keys = ServerKeys(tmp_path, "alice@example.com", "")
    env = keys.container_env(2222, "alice@example.com")
    assert stat.S_IMODE(keys.dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(keys.client_key_file.stat().st_mode) == 0o600
    # The container gets the client key's public half only, and the host key's private half.
    assert env["GPUHUB_SSH_AUTHORIZED_KEY"] == keys.client_key().export_public_key().decode().strip()
    assert "PRIVATE" not in env["GPUHUB_SSH_AUTHORIZED_KEY"]
    assert asyncssh.import_private_key(env["GPUHUB_SSH_HOST_KEY"]).get_fingerprint() == \
        keys.host_key().get_fingerprint()
    assert env["GPUHUB_SSH_LOGIN"] == "jovyan"  # not a POSIX name
    # Kept across starts (a kept container still carries them).
    again = ServerKeys(tmp_path, "alice@example.com", "").container_env(2222, "alice@example.com")
    assert again == env
    assert keys.endpoint() is None
    keys.publish(Endpoint("172.18.0.5", 2222, "jovyan"))
    assert keys.endpoint() == Endpoint("172.18.0.5", 2222, "jovyan")
    keys.withdraw()
    assert keys.endpoint() is None
    # Names are escaped: no way out of the state directory.
    assert ServerKeys(tmp_path, "../x", "").dir.parent.parent == tmp_path / "servers"


@pytest.mark.parametrize("name, login", [("alice", "alice"), ("a.b", "jovyan"), ("Alice", "jovyan"),
                                         ("x" * 40, "jovyan"), ("bob_2", "bob_2")])
def test_login_names(name, login):
    assert login_name(name) == login


def test_tokens_must_reach_the_owners_server():
    assert may_reach_server(["access:servers!user=alice", "read:users"], "alice")
    assert may_reach_server(["access:servers!server=alice/"], "alice")
    assert not may_reach_server(["read:users!user=alice"], "alice")
    assert not may_reach_server(["access:servers!user=bob"], "alice")


def test_ssh_setting_adds_the_service_its_role_and_the_spawners_keys(tmp_path):
    settings = load_settings({"GPUHUB_DATA_DIR": str(tmp_path), "GPUHUB_SSH": "true", "GPUHUB_SSH_PORT": "2022",
                              "GPUHUB_SSH_PAGE_PORT": "8099", "GPUHUB_AUTHENTICATOR": "dummy",
                              "GPUHUB_DUMMY_PASSWORD": "x"})
    c = Config()
    apply_settings(c, settings)
    (service,) = [s for s in c.JupyterHub.services if s["name"] == "gpu-ssh"]
    assert service["url"] == "http://127.0.0.1:8099"
    (role,) = [r for r in c.JupyterHub.load_roles if r["name"] == "gpu-ssh-service"]
    assert set(role["scopes"]) == {"read:users", "read:servers", "servers", "users:activity"}
    assert c.SSHGateway.port == 2022
    assert c.GPUDockerSpawner.ssh_state_dir == str(tmp_path / "ssh")
    user_role = [r for r in c.JupyterHub.load_roles if r["name"] == "user"][0]
    assert "access:services!service=gpu-ssh" in user_role["scopes"]


def test_ssh_is_off_by_default_and_its_page_port_must_not_collide(tmp_path):
    c = Config()
    apply_settings(c, load_settings({"GPUHUB_DATA_DIR": str(tmp_path), "GPUHUB_AUTHENTICATOR": "dummy",
                                     "GPUHUB_DUMMY_PASSWORD": "x"}))
    assert not [s for s in c.JupyterHub.services if s["name"] == "gpu-ssh"]
    with pytest.raises(SettingsError, match="GPUHUB_SSH_PAGE_PORT"):
        load_settings({"GPUHUB_SSH": "true", "GPUHUB_SSH_PAGE_PORT": "8091"})


def test_gateway_limits_refuse_nonsense():
    with pytest.raises(Exception, match="max_channels_per_connection"):
        SSHGateway(max_channels_per_connection=0)
    with pytest.raises(Exception, match="port"):
        SSHGateway(port=70000)
    assert json.dumps(SSHGateway().values())


def test_asyncssh_is_pinned_past_the_terrapin_fix():
    # 2.14.2 brought strict key exchange (CVE-2023-48795, "Terrapin"); older ones accept a
    # prefix-truncation of the handshake.
    import tomllib
    from pathlib import Path

    from packaging.requirements import Requirement
    from packaging.version import Version

    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    (pin,) = [Requirement(r) for r in pyproject["project"]["dependencies"] if r.startswith("asyncssh")]
    assert not pin.specifier.contains(Version("2.14.1")) and pin.specifier.contains(Version("2.14.2"))
    assert Version(asyncssh.__version__) in pin.specifier
