"""Action scripts and the privileged roles around them, without a hub (issue 22, items 6 and 7):
line ends, the output cap read as a stream, the scripts' own executor, the run store, the exec
scope and the directory's DN decision."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
from traitlets.config import Config

from spawner.auth.entries import in_groups
from spawner.poolpage import ADMIN_SCOPE, EXEC_SCOPE, scripts
from spawner.poolpage.hubapi import Server
from spawner.settings.pool_service import ADMIN_GROUP, ADMIN_ROLE, EXEC_GROUP, EXEC_ROLE, configure_pool_page
from spawner.settings import load_settings


@pytest.mark.parametrize("raw", ["cd /tmp\r\npwd\r\nif true; then\r\n echo y\r\nfi\r\n",
                                 "cd /tmp\rpwd\rif true; then\r echo y\rfi\r",
                                 "cd /tmp\npwd\nif true; then\n echo y\nfi\n"])
def test_scripts_run_with_unix_line_ends_whatever_the_browser_sent(raw):
    script, timeout = scripts.check_script(raw, "30")
    assert script == "cd /tmp\npwd\nif true; then\n echo y\nfi\n" and timeout == 30


class FakeExecAPI:
    """docker-py's low-level exec calls, with a script that writes `chunks` KiB."""

    def __init__(self, chunks: int):
        self.chunks, self.read, self.streamed = chunks, 0, None

    def exec_create(self, container_id, cmd, **kwargs):
        assert kwargs["user"] == "1000:100" and kwargs["privileged"] is False
        return {"Id": "e1"}

    def exec_start(self, exec_id, stream=False, demux=False, **kwargs):
        self.streamed = stream
        if not stream:  # the whole output at once: what the cap must not need
            self.read = self.chunks
            return b"x" * 1024 * self.chunks

        def gen():
            for _ in range(self.chunks):
                self.read += 1
                yield b"x" * 1024
        return gen()

    def exec_inspect(self, exec_id):
        return {"ExitCode": 0, "Running": False}


def fake_client(api):
    container = SimpleNamespace(id="c1", attrs={"Config": {"User": "1000:100"}})
    return SimpleNamespace(api=api, containers=SimpleNamespace(list=lambda **kw: [container]))


def test_output_is_streamed_and_kept_only_up_to_the_cap():
    api = FakeExecAPI(chunks=200)  # 200 KiB of output
    result = scripts.exec_in(fake_client(api), "pool", Server("pat", ""), "yes", 30)
    assert api.streamed is True
    assert result.truncated and len(result.output) == scripts.OUTPUT_CAP and result.exit_code == 0
    small = scripts.exec_in(fake_client(FakeExecAPI(chunks=2)), "pool", Server("pat", ""), "echo", 30)
    assert not small.truncated and len(small.output) == 2048


def test_scripts_do_not_wait_for_the_default_executor(monkeypatch):
    """A fan-out runs on the scripts' own threads: with every default-executor thread busy
    (the page's utilisation reads), it still runs."""
    monkeypatch.setattr(scripts, "exec_in", lambda client, pool_id, server, script, timeout:
                        scripts.Result(server.label, 0, "ok"))
    release = threading.Event()

    async def main():
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(1))
        stuck = loop.run_in_executor(None, release.wait, 10)
        try:
            return await asyncio.wait_for(scripts.run_everywhere(None, "pool", [Server("a", ""), Server("b", "")],
                                                                 "true", 5), 5)
        finally:
            release.set()
            await stuck

    assert [r.exit_code for r in asyncio.run(main())] == [0, 0]


def test_runs_are_kept_bounded_and_say_what_is_done():
    store = scripts.RunStore(max_runs=2)
    servers = [Server("pat", ""), Server("bob", "")]
    first = store.start("ada", "users pat, bob", servers, "true", 30)
    assert first.as_dict()["done"] is False and [r["server"] for r in first.as_dict()["results"]] == ["pat", "bob"]
    first.finish_one(scripts.Result("bob", 0, "fine"))
    assert {r["server"]: r["state"] for r in first.as_dict()["results"]} == {"pat": "running", "bob": "done"}
    first.finish_one(scripts.Result("pat", 3, "bad"))
    assert first.as_dict()["done"] is False  # until the audit has the exit codes
    first.end()
    assert first.as_dict()["done"] is True and first.exit_codes() == "bob: exit 0, pat: exit 3"
    second = store.start("ada", "users pat", servers[:1], "true", 30)
    third = store.start("ada", "users pat", servers[:1], "true", 30)
    assert store.get(first.id) is None and store.get(second.id) is second and store.get(third.id) is third


def _settings(**env):
    return load_settings({"GPUHUB_AUTHENTICATOR": "dummy", "GPUHUB_DUMMY_PASSWORD": "x", **env})


def test_running_code_in_other_peoples_servers_is_a_scope_granted_to_no_one_by_default(tmp_path):
    c = Config()
    configure_pool_page(c, _settings(GPUHUB_DATA_DIR=str(tmp_path), GPUHUB_ADMIN_USERS="ada"))
    roles = {r["name"]: r for r in c.JupyterHub.load_roles}
    assert EXEC_SCOPE in c.JupyterHub.custom_scopes and EXEC_SCOPE not in roles[ADMIN_ROLE]["scopes"]
    assert roles[EXEC_ROLE]["scopes"] == [EXEC_SCOPE] and roles[EXEC_ROLE]["users"] == []
    assert EXEC_SCOPE not in roles["user"]["scopes"]
    [service] = c.JupyterHub.services
    assert set(service["oauth_client_allowed_scopes"]) == {ADMIN_SCOPE, EXEC_SCOPE}
    c = Config()
    configure_pool_page(c, _settings(GPUHUB_DATA_DIR=str(tmp_path), GPUHUB_POOL_EXEC_USERS="ada, root-ish"))
    roles = {r["name"]: r for r in c.JupyterHub.load_roles}
    assert roles[EXEC_ROLE]["users"] == ["ada", "root-ish"]


def test_privileged_roles_go_to_groups_only_the_directory_login_fills():
    """The roles name the hub groups the authenticator fills from its DN decision, never a
    directory group's name; the directory's admin and exec groups go to the authenticator."""
    c = Config()
    env = {"GPUHUB_AUTHENTICATOR": "ldap", "GPUHUB_DIRECTORY": "openldap", "GPUHUB_DIRECTORY_SERVER": "ldap.test",
           "GPUHUB_DIRECTORY_USER_BASE": "ou=people,dc=x", "GPUHUB_DIRECTORY_ALLOWED_GROUPS": "gpu-users",
           "GPUHUB_DIRECTORY_ADMIN_GROUPS": "hub-admins",
           "GPUHUB_DIRECTORY_EXEC_GROUPS": "cn=ops,ou=groups,dc=x", "JUPYTERHUB_CRYPT_KEY": "ab" * 32}
    settings = load_settings(env)
    configure_pool_page(c, settings)
    roles = {r["name"]: r for r in c.JupyterHub.load_roles}
    assert roles[ADMIN_ROLE]["groups"] == [ADMIN_GROUP] and roles[EXEC_ROLE]["groups"] == [EXEC_GROUP]
    assert c.DirectoryAuthenticator.role_groups == {ADMIN_GROUP: ["hub-admins"],
                                                    EXEC_GROUP: ["cn=ops,ou=groups,dc=x"]}


REAL = "cn=hub-admins,ou=groups,dc=x"
ROGUE = "cn=hub-admins,ou=projects,ou=groups,dc=x"


def test_privileged_groups_are_matched_by_dn():
    state = {"groups": ["hub-admins"], "group_dns": [ROGUE]}
    # a name two directory groups carry decides nothing
    assert not in_groups(["hub-admins"], state, names={"hub-admins": [REAL, ROGUE]})
    # a name carried by one group is that group's DN: the rogue member is not in it
    assert not in_groups(["hub-admins"], state, names={"hub-admins": [REAL]})
    assert in_groups(["hub-admins"], {"groups": ["hub-admins"], "group_dns": [REAL]}, names={"hub-admins": [REAL]})
    assert in_groups([REAL.upper()], {"groups": [], "group_dns": [REAL]}, names={})
    # without resolved names (allowed_groups), names match as before
    assert in_groups(["hub-admins"], state)
