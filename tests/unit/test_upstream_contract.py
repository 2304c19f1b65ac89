"""The private parts of JupyterHub and DockerSpawner this project relies on, by name.

Each test checks the member's attributes and what it does (called, or through the public
call that uses it), never the text of upstream's source: a reformatted upstream passes, a
changed behaviour fails.

Each member below is not public API: an upgrade may rename or remove it without
notice, and the code using it would then fail silently (every stop recorded as
`stopped`, the reconciler never starting, a spawn limit applied twice).  These
tests fail loudly instead, naming the member and the module of ours that needs
it, so an upgrade's first run says what to look at.  When one of them goes away
in our code, remove its test here.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from dockerspawner import DockerSpawner, SwarmSpawner
from jupyterhub.app import JupyterHub
from jupyterhub.handlers.base import BaseHandler
from jupyterhub.spawner import Spawner

pytestmark = pytest.mark.unit


PACKAGE = Path(__file__).resolve().parents[2] / "spawner"


def upstream_privates_used_without_a_contract(package: Path, contract: str) -> dict[str, list[str]]:
    """The private members of Spawner, DockerSpawner and SwarmSpawner that code under `package`
    reads (`self._x`, `spawner._x`, `DockerSpawner._x`) and never defines itself, which
    `contract` (this file's text) does not name: each is an upgrade that would break silently."""
    upstream = {name for cls in (Spawner, DockerSpawner, SwarmSpawner) for name in vars(cls)
                if name.startswith("_") and not name.startswith("__")}
    sources = {module: module.read_text() for module in package.rglob("*.py")}
    ours = {m.group(1) or m.group(2) for text in sources.values()
            for m in re.finditer(r"def (_[a-z]\w*)\(|self\.(_[a-z]\w*) *(?::|=[^=])", text)}
    used: dict[str, list[str]] = {}
    pattern = re.compile(r"\b(?:self|spawner|DockerSpawner|SwarmSpawner|Spawner)\.(_[a-z]\w*)")
    for module, text in sorted(sources.items()):
        for m in pattern.finditer(text):
            name = m.group(1)
            if name in upstream and name not in ours and not re.search(rf"\b{name}\b", contract):
                used.setdefault(name, []).append(str(module.relative_to(package.parent)))
    return used


def test_every_upstream_private_our_code_uses_has_a_contract_test_here():
    contract = Path(__file__).read_text()
    assert upstream_privates_used_without_a_contract(PACKAGE, contract) == {}


def test_the_contract_rule_finds_a_private_used_without_a_test(tmp_path):
    (tmp_path / "spawner").mkdir()
    (tmp_path / "spawner" / "mod.py").write_text(
        "class S:\n    def f(self):\n        self._own = 1\n        return self._log_name, self._own\n")
    found = upstream_privates_used_without_a_contract(tmp_path / "spawner", contract="")
    assert found == {"_log_name": ["spawner/mod.py"]}


def test_spawner_stop_pending_is_a_class_flag_read_by_pending():
    # spawner/lending/spawner.py: a lease is settled in poll() only when no stop is under way.
    spawner = Spawner()
    assert Spawner._stop_pending is False and spawner.pending is None
    spawner._stop_pending = True
    assert spawner.pending == "stop"

@pytest.fixture
def initialized_hub(tmp_path):
    """A JupyterHub app after initialize() (its database, services and tornado settings made;
    nothing started: no proxy, no subprocess)."""
    import asyncio

    JupyterHub.clear_instance()
    app = JupyterHub.instance(db_url=f"sqlite:///{tmp_path / 'hub.sqlite'}",
                              cookie_secret_file=str(tmp_path / "secret"), pid_file="",
                              concurrent_spawn_limit=7, authenticator_class="null")
    asyncio.run(app.initialize([]))
    try:
        yield app
    finally:
        app.db.close()
        JupyterHub.clear_instance()


def test_hub_app_has_a_start_future_resolved_when_it_has_started(initialized_hub):
    # spawner/engines/common/reconciler.py awaits it, so the first pass runs once the hub is up: made by
    # initialize(), still pending until start() sets it.
    import asyncio

    assert isinstance(initialized_hub._start_future, asyncio.Future)
    assert not initialized_hub._start_future.done()

def test_nothing_reads_who_stopped_a_server_from_the_hub_s_handlers_any_more():
    # Who ended a server is recorded by the asker in the ledger (end intents); the stack walk
    # for BaseHandler._jupyterhub_user is gone and must not come back.
    for module in PACKAGE.rglob("*.py"):
        source = module.read_text()
        assert "_jupyterhub_user" not in source and "_getframe" not in source, module


def test_spawn_limit_is_read_from_the_tornado_settings_by_that_key(initialized_hub):
    # spawner/lending/admission.py moves `concurrent_spawn_limit` out of the settings to count starts only.
    assert initialized_hub.tornado_settings["concurrent_spawn_limit"] == 7
    read = BaseHandler.concurrent_spawn_limit.fget
    assert read(SimpleNamespace(settings={"concurrent_spawn_limit": 3})) == 3
    assert read(SimpleNamespace(settings={})) == 0

def test_dockerspawner_eval_if_callable_takes_one_value():
    # spawner/engines/docker/spawner.py evaluates per-user options with it, as DockerSpawner does.
    params = list(inspect.signature(DockerSpawner._eval_if_callable).parameters)
    assert params == ["self", "x"]
    spawner = DockerSpawner()
    assert spawner._eval_if_callable(lambda s: s is spawner) is True
    assert spawner._eval_if_callable({"k": 1}) == {"k": 1}

def _user(name="a.b"):
    return SimpleNamespace(name=name, id=1, url=f"/user/{name}/")


@pytest.mark.parametrize("cls", [DockerSpawner, SwarmSpawner])
def test_dockerspawner_inspects_its_object_through_get_object(cls):
    # spawner/engines/common/container_spawner.py wraps get_object() to keep the container's (or the
    # service's) labels for poll(), which adopts the lease they name; on Swarm, poll() reaches
    # the service through get_task(), which inspects it with get_object().
    import asyncio

    assert inspect.iscoroutinefunction(cls.get_object)
    asked = []

    class Asked(cls):  # type: ignore[misc, valid-type]
        async def get_object(self):
            asked.append(self)
            return None  # gone

    spawner = Asked(user=_user(), name="")
    assert asyncio.run(spawner.poll()) == 0
    assert asked == [spawner]

def test_dockerspawner_renders_templates_of_one_object_in_the_user_s_namespace():
    # spawner/engines/swarm/spawner.py (the home mount and its driver options) and spawner/engines/common/homes.py (the
    # home volume's name) render `{username}` through DockerSpawner._render_templates.
    params = list(inspect.signature(DockerSpawner._render_templates).parameters)
    assert params == ["self", "obj", "ns"]
    spawner = DockerSpawner(user=_user(), name="")
    assert spawner._render_templates({"o": ["{x}-1", "{x}"]}, {"x": "v"}) == {"o": ["v-1", "v"]}
    # without a namespace, the user's own (the escaped name)
    assert spawner._render_templates("/home/{username}") == "/home/a-2eb"

def test_traitlets_finds_a_configurables_sections_through_section_names():
    # spawner/engines/common/container_spawner.py adds the `GPUDockerSpawner` section to the Swarm spawner's
    # by overriding Configurable.section_names; loading and reloading config must both ask it.
    from traitlets import Int
    from traitlets.config import Config, Configurable

    class Base(Configurable):
        option = Int(0).tag(config=True)

    class Engine(Base):
        @classmethod
        def section_names(cls):
            names = super().section_names()
            names.insert(names.index("Base") + 1, "Extra")
            return names

    engine = Engine(config=Config({"Extra": {"option": 3}}))
    assert engine.option == 3
    engine.update_config(Config({"Extra": {"option": 5}}))
    assert engine.option == 5
    # ...the class's own section, last, still wins
    assert Engine(config=Config({"Extra": {"option": 3}, "Engine": {"option": 4}})).option == 4

def _handler(headers=None):
    """A tornado handler of a request with `headers`, as a service's page gets one."""
    from unittest.mock import Mock

    from tornado import httputil, web

    request = httputil.HTTPServerRequest(method="GET", uri="/services/x/",
                                         headers=httputil.HTTPHeaders(headers or {}), connection=Mock())
    return web.RequestHandler(web.Application(cookie_secret="x" * 32), request)


def _hub_auth(found: dict | None):
    from jupyterhub.services.auth import HubAuth

    class Auth(HubAuth):
        asked = None

        async def user_for_token(self, token, use_cache=True, session_id="", *, sync=True):
            self.asked = token
            return found

    return Auth(api_token="t" * 32, api_url="http://127.0.0.1:9/hub/api")


def test_hub_auth_get_user_is_async_on_request_and_caches_on_the_handler():
    # spawner/poolpage/handlers.py and spawner/ssh/keys_api.py (whose loop also relays SSH traffic)
    # ask the hub who a request is in prepare(), without blocking the loop, then rely on HubAuth
    # keeping the answer in `handler._cached_hub_user`.
    import asyncio

    auth, handler = _hub_auth({"name": "ada"}), _handler({"Authorization": "token abc"})
    assert asyncio.run(auth.get_user(handler, sync=False)) == {"name": "ada"}
    assert handler._cached_hub_user == {"name": "ada"} and auth.asked == "abc"
    auth.asked = None
    assert asyncio.run(auth.get_user(handler, sync=False)) == {"name": "ada"}
    assert auth.asked is None  # the handler's answer, not the hub asked again


def test_hub_auth_marks_a_request_it_identified_by_a_token():
    # spawner/reauth.py asks for the password again on cookie-authenticated requests only: it
    # reads `handler._token_authenticated`, which HubAuth sets when a token (never a cookie)
    # identified the request.
    import asyncio

    by_token = _handler({"Authorization": "token abc"})
    asyncio.run(_hub_auth({"name": "ada"}).get_user(by_token, sync=False))
    assert by_token._token_authenticated is True
    no_token = _handler()
    assert asyncio.run(_hub_auth({"name": "ada"}).get_user(no_token, sync=False)) is None
    assert not getattr(no_token, "_token_authenticated", False)

def test_dockerspawner_escapes_a_user_name_with_its_own_escape():
    # spawner/jobs/runner.py renders a job's home volume name with DockerSpawner._escape, so a job
    # mounts the very volume the user's server does.
    assert isinstance(inspect.getattr_static(DockerSpawner, "_escape"), staticmethod)
    assert DockerSpawner._escape("a.b@c") == "a-2eb-40c"
    # ...and it is the default of the `escape` trait that a server's {username} goes through.
    assert DockerSpawner().escape is DockerSpawner._escape

def test_dockerspawner_legacy_escape_is_its_old_escape_by_behaviour():
    # spawner/engines/common/job_containers.py and spawner/settings/pool_jobs.py follow `escape = "legacy"` with
    # DockerSpawner._legacy_escape (escapism with `_` and upper-case hex), so a job of a hub that
    # kept the old volume names mounts the same home as the user's server.
    assert isinstance(inspect.getattr_static(DockerSpawner, "_legacy_escape"), staticmethod)
    assert DockerSpawner._legacy_escape("alice") == "alice"
    assert DockerSpawner._legacy_escape("a.b-c_d") == "a_2Eb-c_5Fd"
    assert DockerSpawner._legacy_escape("\u00c9mile x") == "_C3_89mile_20x"
    # ...and it is what DockerSpawner itself uses when an admin sets escape = "legacy".
    assert DockerSpawner(escape="legacy").escape is DockerSpawner._legacy_escape


def test_dockerspawner_object_name_default_renders_the_name_template():
    # spawner/engines/common/container_spawner.py asks DockerSpawner._object_name_default for the name that
    # start() will give the container (service), to refuse one that is a batch job's name.
    assert DockerSpawner._trait_default_generators["object_name"] is DockerSpawner._object_name_default
    spawner = DockerSpawner(name_template="{prefix}-{username}-x", prefix="lab", name="",
                            user=SimpleNamespace(name="a.b", id=1, url="/user/a.b/"))
    assert spawner._object_name_default() == "lab-a-2eb-x" == spawner.object_name


def test_a_user_makes_a_scoped_expiring_token_and_the_orm_finds_it_by_value():
    # spawner/engines/swarm/stopping.py asks an adopted server to exit with a token it makes through
    # JupyterHub's User wrapper (passed through to orm.User.new_api_token, as User.spawn does)
    # and deletes it again after finding it with orm.APIToken.find.
    from jupyterhub import orm
    from jupyterhub.user import User

    db = orm.new_session_factory("sqlite://")()
    try:
        orm_user = orm.User(name="ada")
        orm_user.roles.append(orm.Role(name="user", scopes=["self"]))  # as the hub gives every user
        db.add(orm_user)
        db.add(orm.OAuthClient(identifier="jupyterhub"))  # the hub's own client, made at its start
        db.commit()
        user = User(orm_user, settings={}, db=db)
        token = user.new_api_token(note="gpu-swarm: stop", scopes=["access:servers!server=ada/"],
                                    expires_in=60)
        found = orm.APIToken.find(db, token)
        assert found is not None and found.user is orm_user and found.note == "gpu-swarm: stop"
        assert found.expires_at is not None and "access:servers!server=ada/" in found.scopes
        db.delete(found)
        db.commit()
        assert orm.APIToken.find(db, token) is None
    finally:
        db.close()


def test_docker_py_privates_the_log_followers_use_are_there_by_behaviour():
    # engines/common/docker_api.py: a Swarm service's followed logs (no public call for them)
    # and the socket under a log stream (its read timeout cleared, so a quiet job's follower waits).
    import docker
    from docker.types.daemon import CancellableStream

    api = docker.APIClient(base_url="tcp://127.0.0.1:9", version="1.41")
    try:
        assert api._url("/services/{0}/logs", "gpuhub-job-7").endswith("/v1.41/services/gpuhub-job-7/logs")
        for name in ("_get", "_raise_for_status", "_multiplexed_response_stream_helper"):
            assert callable(getattr(api, name)), name
    finally:
        api.close()
    stream = CancellableStream(iter(()), SimpleNamespace(raw=None))
    assert hasattr(stream, "_response")


def test_a_log_stream_whose_socket_cannot_be_found_is_said_in_the_log_not_swallowed(caplog):
    from spawner.engines.common.docker_api import no_read_timeout

    with caplog.at_level("WARNING", logger="gpu-pool.docker-api"):
        assert no_read_timeout(SimpleNamespace(_response=SimpleNamespace(raw=None))) is False
    assert "read timeout" in caplog.text
