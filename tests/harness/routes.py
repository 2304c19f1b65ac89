"""Every HTTP route the project serves, read from the apps' own route tables, and the routes
docs/reference/rest-api.md documents.

Served: the gpu-pool service (`spawner.poolpage.app.make_app`), the gpu-ssh key page
(`spawner.ssh.keys_api.make_app`) and the two jupyter-server extensions of the notebook
images (`gpuhub_activity`, `gpuhub_scripts`), each built as it is at run time and its
`add_handlers` / route list read.  A route is `METHOD /path`, each regex group of the path
written `<>` (a group of literal alternatives, `(drain|undrain)`, gives one route per
alternative); the methods are those the handler class defines.

Documented: every `` `METHOD /path` `` in the page (a query string after `?` left out),
`<anything>` in the path read as `<>`.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import types
from pathlib import Path

from tornado import web

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "reference" / "rest-api.md"
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
# The prefix a notebook server's routes are shown under (its base_url: the default server's).
SERVER_BASE = "/user/<name>/"


def handler_methods(cls: type) -> list[str]:
    """The HTTP methods a handler class answers (those it, or a base of its own, defines)."""
    return [m for m in METHODS if getattr(cls, m.lower()) is not getattr(web.RequestHandler, m.lower())]


def _groups(pattern: str) -> list[str]:
    """A route's regex as documented paths: groups of literal alternatives expanded, other groups `<>`."""
    pattern = pattern.removesuffix("$")
    match = re.search(r"\(([^()]*)\)", pattern)
    if match is None:
        return [pattern.replace("\\", "")]
    head, tail, body = pattern[:match.start()], pattern[match.end():], match.group(1)
    choices = body.split("|") if re.fullmatch(r"[\w-]+(\|[\w-]+)+", body) else ["<>"]
    return [head.replace("\\", "") + c + rest for c in choices for rest in _groups(tail)]


def _rules(app_rules) -> set[str]:
    out = set()
    for rule in app_rules:
        pattern, handler = (rule.matcher.regex.pattern, rule.target) if hasattr(rule, "matcher") else rule[:2]
        for path in _groups(pattern):
            for method in handler_methods(handler):
                out.add(f"{method} {path}")
    return out


def pool_service() -> set[str]:
    from spawner.poolpage.app import make_app

    app = make_app(pool=None, prefix="/services/gpu-pool/", base_url="/", show_holders=True)  # type: ignore[arg-type]
    return _rules(app.wildcard_router.rules)


def ssh_service(state_dir: Path) -> set[str]:
    from spawner.ssh.key_store import KeyStore
    from spawner.ssh.keys_api import make_app

    app = make_app(KeyStore(state_dir, 10, 16384, 3072), "/services/gpu-ssh/", 2222, "", 10, recheck=None)  # type: ignore[arg-type]
    return _rules(app.wildcard_router.rules)


class _WebApp:
    def __init__(self):
        self.settings = {"base_url": SERVER_BASE}
        self.added: list = []

    def add_handlers(self, host: str, handlers: list) -> None:
        self.added.extend(handlers)


def _load(name: str):
    path = REPO / "images" / "jupyter" / name / "__init__.py"
    spec = importlib.util.spec_from_file_location(name, path, submodule_search_locations=[str(path.parent)])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def notebook_server() -> set[str]:
    """The routes the images' extensions add to each notebook server (jupyter-server stood in
    for by tornado's RequestHandler: this checkout's environment has no jupyter-server)."""
    from jupyterhub.utils import url_path_join
    from traitlets.config import Application

    stand_ins = {"jupyter_server": types.ModuleType("jupyter_server"),
                 "jupyter_server.base": types.ModuleType("jupyter_server.base"),
                 "jupyter_server.base.handlers": types.ModuleType("jupyter_server.base.handlers"),
                 "jupyter_server.utils": types.ModuleType("jupyter_server.utils")}
    stand_ins["jupyter_server.base.handlers"].APIHandler = web.RequestHandler  # type: ignore[attr-defined]
    stand_ins["jupyter_server.utils"].url_path_join = url_path_join  # type: ignore[attr-defined]
    saved = {k: sys.modules.get(k) for k in [*stand_ins, "gpuhub_activity", "gpuhub_activity.lab",
                                                  "gpuhub_activity.notify", "gpuhub_scripts"]}
    sys.modules.update(stand_ins)
    try:
        serverapp = Application()
        serverapp.web_app = _WebApp()  # type: ignore[attr-defined]
        _load("gpuhub_scripts")._load_jupyter_server_extension(serverapp)
        _load("gpuhub_activity")
        from gpuhub_activity import lab, notify  # type: ignore[import-not-found]

        lab.load(serverapp)
        notify.load(serverapp)
        return _rules(serverapp.web_app.added)  # type: ignore[attr-defined]
    finally:
        for key, module in saved.items():
            if module is None:
                sys.modules.pop(key, None)
            else:
                sys.modules[key] = module


def served(state_dir: Path) -> set[str]:
    return pool_service() | ssh_service(state_dir) | notebook_server()


def normalise(route: str) -> str:
    return re.sub(r"<[^>]*>", "<>", route)


def documented(text: str | None = None) -> set[str]:
    text = PAGE.read_text() if text is None else text
    found = re.findall(r"`(" + "|".join(METHODS) + r") (/[^`\s?]*)", text)
    return {normalise(f"{method} {path}") for method, path in found}
