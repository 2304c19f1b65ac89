"""The private parts of JupyterHub and DockerSpawner this project relies on, by name.

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


def _source(obj) -> str:
    return inspect.getsource(obj)


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
    assert Spawner._stop_pending is False
    assert "_stop_pending" in _source(Spawner.pending.fget)


def test_hub_app_has_a_start_future_resolved_when_it_has_started():
    # spawner/reconciler.py awaits it, so the first pass runs once the hub is up.
    source = _source(JupyterHub)
    assert "self._start_future = asyncio.Future()" in source
    assert "self._start_future.set_result(None)" in source


def test_nothing_reads_who_stopped_a_server_from_the_hub_s_handlers_any_more():
    # Who ended a server is recorded by the asker in the ledger (end intents); the stack walk
    # for BaseHandler._jupyterhub_user is gone and must not come back.
    for module in PACKAGE.rglob("*.py"):
        source = module.read_text()
        assert "_jupyterhub_user" not in source and "_getframe" not in source, module


def test_spawn_limit_is_read_from_the_tornado_settings_by_that_key():
    # spawner/lending/admission.py moves `concurrent_spawn_limit` out of the settings to count starts only.
    assert "self.settings.get('concurrent_spawn_limit'" in _source(BaseHandler.concurrent_spawn_limit.fget)
    assert "concurrent_spawn_limit=self.concurrent_spawn_limit" in _source(JupyterHub.init_tornado_settings)


def test_dockerspawner_eval_if_callable_takes_one_value():
    # spawner/docker/spawner.py evaluates per-user options with it, as DockerSpawner does.
    params = list(inspect.signature(DockerSpawner._eval_if_callable).parameters)
    assert params == ["self", "x"]


def test_dockerspawner_inspects_its_object_through_get_object():
    # spawner/lending/docker_common.py wraps get_object() to keep the container's (or the
    # service's) labels for poll(), which adopts the lease they name.
    assert inspect.iscoroutinefunction(DockerSpawner.get_object)
    assert "get_object" in _source(DockerSpawner.poll)
    # On Swarm, poll() reaches the service through get_task(), which inspects it with get_object().
    assert "get_task" in _source(SwarmSpawner.poll)
    assert "self.get_object()" in _source(SwarmSpawner.get_task)


def test_dockerspawner_renders_templates_of_one_object_in_the_user_s_namespace():
    # spawner/swarm/spawner.py (the home mount and its driver options) and spawner/homes.py (the
    # home volume's name) render `{username}` through DockerSpawner._render_templates.
    params = list(inspect.signature(DockerSpawner._render_templates).parameters)
    assert params == ["self", "obj", "ns"]
    assert "self.template_namespace()" in _source(DockerSpawner._render_templates)


def test_traitlets_finds_a_configurables_sections_through_section_names():
    # spawner/lending/docker_common.py adds the `GPUDockerSpawner` section to the Swarm spawner's
    # by overriding Configurable.section_names; loading and reloading config must both ask it.
    from traitlets.config import Configurable

    assert "self.section_names()" in _source(Configurable._find_my_config)
    source = _source(Configurable)
    config_changed = source[source.index("def _config_changed("):].split("\n    def ")[0]
    assert "section_names = self.section_names()" in config_changed


def test_hub_auth_get_user_is_async_on_request_and_caches_on_the_handler():
    # spawner/poolpage/handlers.py and spawner/ssh/keys_api.py (whose loop also relays SSH traffic)
    # ask the hub who a request is in prepare(), without blocking the loop, then rely on HubAuth
    # keeping the answer in `handler._cached_hub_user`.
    from jupyterhub.services.auth import HubAuth

    assert "sync" in inspect.signature(HubAuth.get_user).parameters
    source = _source(HubAuth._get_user)
    assert "handler._cached_hub_user" in source and "hasattr(handler, '_cached_hub_user')" in source


def test_hub_auth_marks_a_request_it_identified_by_a_token():
    # spawner/reauth.py asks for the password again on cookie-authenticated requests only: it
    # reads `handler._token_authenticated`, which HubAuth sets when a token (never a cookie)
    # identified the request, checked before any cookie.
    from jupyterhub.services.auth import HubAuth

    source = _source(HubAuth._get_user)
    assert "handler._token_authenticated = True" in source
    assert source.index("get_token(handler, in_cookie=False)") < source.index("_get_user_cookie(handler)")


def test_dockerspawner_escapes_a_user_name_with_its_own_escape():
    # spawner/jobs/runner.py renders a job's home volume name with DockerSpawner._escape, so a job
    # mounts the very volume the user's server does.
    assert isinstance(inspect.getattr_static(DockerSpawner, "_escape"), staticmethod)
    assert DockerSpawner._escape("a.b@c") == "a-2eb-40c"
    # ...and it is the default of the `escape` trait that a server's {username} goes through.
    assert "return self._escape" in _source(DockerSpawner._escape_default.func)


def test_dockerspawner_legacy_escape_is_its_old_escape_by_behaviour():
    # spawner/docker/jobs.py and spawner/settings/jobs.py follow `escape = "legacy"` with
    # DockerSpawner._legacy_escape (escapism with `_` and upper-case hex), so a job of a hub that
    # kept the old volume names mounts the same home as the user's server.
    assert isinstance(inspect.getattr_static(DockerSpawner, "_legacy_escape"), staticmethod)
    assert DockerSpawner._legacy_escape("alice") == "alice"
    assert DockerSpawner._legacy_escape("a.b-c_d") == "a_2Eb-c_5Fd"
    assert DockerSpawner._legacy_escape("\u00c9mile x") == "_C3_89mile_20x"
    # ...and it is what DockerSpawner itself uses when an admin sets escape = "legacy".
    assert DockerSpawner(escape="legacy").escape is DockerSpawner._legacy_escape


def test_dockerspawner_object_name_default_renders_the_name_template():
    # spawner/lending/docker_common.py asks DockerSpawner._object_name_default for the name that
    # start() will give the container (service), to refuse one that is a batch job's name.
    assert DockerSpawner._trait_default_generators["object_name"] is DockerSpawner._object_name_default
    spawner = DockerSpawner(name_template="{prefix}-{username}-x", prefix="lab", name="",
                            user=SimpleNamespace(name="a.b", id=1, url="/user/a.b/"))
    assert spawner._object_name_default() == "lab-a-2eb-x" == spawner.object_name


def test_a_user_makes_a_scoped_expiring_token_and_the_orm_finds_it_by_value():
    # spawner/swarm/stopping.py asks an adopted server to exit with a token it makes through
    # JupyterHub's User wrapper (passed through to orm.User.new_api_token, as User.spawn does)
    # and deletes it again after finding it with orm.APIToken.find.
    from jupyterhub import orm
    from jupyterhub.user import User

    assert "self.new_api_token(" in _source(User.spawn)
    assert "return getattr(self.orm_user, attr)" in _source(User.__getattr__)
    params = inspect.signature(orm.APIToken.new).parameters
    assert {"user", "scopes", "note", "expires_in"} <= set(params)
    assert list(inspect.signature(orm.APIToken.find).parameters)[:2] == ["db", "token"]
