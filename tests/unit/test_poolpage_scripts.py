"""Action scripts and the privileged roles around them, without a hub (issue 22, items 6 and 7):
line ends, the output cap read as a stream in the server, the route through each server, the run store, the exec
scope and the directory's DN decision."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from traitlets.config import Config

from spawner.auth.entries import in_groups
from spawner.poolpage import ADMIN_SCOPE, EXEC_SCOPE, scripts
from spawner.services.hub_api import Server
from spawner.settings import load_settings
from spawner.settings.pool_service import ADMIN_GROUP, ADMIN_ROLE, EXEC_GROUP, EXEC_ROLE
from spawner.settings.pool_service import configure_pool_page as configure_page_options
from spawner.settings.services import set_hub_services


@pytest.mark.parametrize("raw", ["cd /tmp\r\npwd\r\nif true; then\r\n echo y\r\nfi\r\n",
                                 "cd /tmp\rpwd\rif true; then\r echo y\rfi\r",
                                 "cd /tmp\npwd\nif true; then\n echo y\nfi\n"])
def test_scripts_run_with_unix_line_ends_whatever_the_browser_sent(raw):
    script, timeout = scripts.check_script(raw, "30")
    assert script == "cd /tmp\npwd\nif true; then\n echo y\nfi\n" and timeout == 30


def _extension():
    """The gpuhub_scripts extension of the images, imported from images/jupyter."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "images" / "jupyter" / "gpuhub_scripts" / "__init__.py"
    spec = importlib.util.spec_from_file_location("gpuhub_scripts_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_script_in_the_server_is_read_as_a_stream_and_kept_only_up_to_the_cap():
    ext = _extension()
    # 200 MB of output: read and thrown away past the cap, and the script runs to its end.
    big = asyncio.run(ext.run_script("head -c 200000000 /dev/zero | tr '\\0' x; echo; echo end; exit 3", 60))
    assert big["truncated"] and len(big["output"]) == ext.OUTPUT_CAP and big["exit_code"] == 3
    small = asyncio.run(ext.run_script("echo out; echo err >&2", 30))
    assert small == {"exit_code": 0, "output": "out\nerr\n", "truncated": False, "timed_out": False}
    slow = asyncio.run(ext.run_script("echo started; sleep 30", 1))
    assert slow["timed_out"] and slow["exit_code"] == 124 and slow["output"] == "started\n"


def _fake_servers(answers: dict):
    """A real HTTP server on 127.0.0.1 answering each server's script URL as `answers[user]`
    (status, body); the number of requests in flight at once is recorded."""
    import json
    import socket

    from tornado import web
    from tornado.httpserver import HTTPServer

    seen = {"now": 0, "most": 0, "auth": set()}

    class Script(web.RequestHandler):
        async def post(self, user):
            seen["now"] += 1
            seen["most"] = max(seen["most"], seen["now"])
            seen["auth"].add((user, self.request.headers.get("Authorization")))
            await asyncio.sleep(0.2)  # a slow script: the calls overlap, so the bound on them shows
            seen["now"] -= 1
            status, body = answers[user]
            self.set_status(status)
            self.finish(json.dumps(body))

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.setblocking(False)
    server = HTTPServer(web.Application([(r"/user/([^/]+)/api/gpuhub/script", Script)]))
    server.add_sockets([sock])
    return server, sock.getsockname()[1], seen


class FakeTokens:
    """The two calls ServerRoute makes of the hub's API: a token per request, then its deletion."""

    def __init__(self, refuse: tuple[str, ...] = ()):
        self.made: dict[str, tuple[str, str, int]] = {}  # token id -> (user, scope, expires_in)
        self.live: set[str] = set()
        self.refuse = refuse

    async def server_token(self, user, server, note, expires_in):
        from spawner.services.hub_api import HubUnavailable

        if user in self.refuse:
            raise HubUnavailable("The hub's API answered POST with 403")
        token_id = f"a{len(self.made)}"
        self.made[token_id] = (user, f"access:servers!server={user}/{server}", expires_in)
        self.live.add(token_id)
        return f"token-of-{user}-{token_id}", token_id

    async def drop_token(self, user, token_id):
        assert self.made[token_id][0] == user
        self.live.discard(token_id)


def test_scripts_reach_each_server_with_a_token_of_its_own_user_deleted_after_bounded():
    result = {"exit_code": 0, "output": "ok\n", "truncated": False, "timed_out": False}
    users = [f"u{i}" for i in range(scripts.PARALLEL + 4)]
    answers = {u: (200, result) for u in users}
    answers["old"] = (404, {"message": "Not Found"})
    answers["root"] = (403, {"message": "This server runs as root: scripts run only as a server's own user"})
    answers["liar"] = (200, {"output": "x" * (scripts.OUTPUT_CAP + 1)})
    hub = FakeTokens(refuse=("blocked",))

    async def main():
        server, port, seen = _fake_servers(answers)
        route = scripts.ServerRoute(f"http://127.0.0.1:{port}", hub)
        try:
            servers = [Server(u, "", url=f"/user/{u}/") for u in [*users, "old", "root", "liar", "blocked"]]
            return await scripts.run_everywhere(route, servers, "true", 5), seen
        finally:
            server.stop()

    results, seen = asyncio.run(main())
    by = {r.server: r for r in results}
    assert all(by[u].exit_code == 0 and by[u].output == "ok\n" for u in users)
    assert seen["most"] == scripts.PARALLEL
    # Each server saw one credential, made for its own user and its own server only, that
    # lives no longer than the script's timeout and a margin, and is deleted once used.
    for user, header in seen["auth"]:
        token_id = header.rsplit("-", 1)[1]
        assert header == f"token token-of-{user}-{token_id}"
        assert hub.made[token_id][:2] == (user, f"access:servers!server={user}/")
        assert hub.made[token_id][2] <= 5 + 120
    assert len(seen["auth"]) == len(users) + 3 and not hub.live
    assert by["old"].exit_code is None and "no gpuhub_scripts extension" in by["old"].error
    assert by["root"].exit_code is None and "runs as root" in by["root"].error
    assert by["liar"].exit_code is None and "not a script result" in by["liar"].error
    # The hub made no token: nothing is sent there, and the admin reads why.
    assert by["blocked"].exit_code is None and "made no token" in by["blocked"].error
    assert "blocked" not in {user for user, _ in seen["auth"]}
    # A server that does not answer at all is a result too, not an error of the run; its token is gone too.
    [gone] = asyncio.run(scripts.run_everywhere(scripts.ServerRoute("http://127.0.0.1:9", hub),
                                                 [Server("gone", "", url="/user/gone/")], "true", 5))
    assert gone.exit_code is None and "did not answer" in gone.error and not hub.live


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


def configure_pool_page(c, settings):
    """The gpu-pool service's part of the hub's config, as apply_settings makes it (no culler, no jobs)."""
    configure_page_options(c, settings)
    set_hub_services(c, dataclasses.replace(settings, cull=False, jobs=False, ssh=False))


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
